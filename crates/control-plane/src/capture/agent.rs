//! One `NodeAgent.Capture` call, bounded: connect and answer within the
//! deadline, and no answer larger than the bound given.

use std::time::Duration;

use edgeprof_proto::v1;

/// Calls `Capture` on the agent at `address` with `secret`, accepting an
/// answer of at most `max_bytes`; the error is the failure's reason.
pub async fn call_agent(
    address: &str,
    request: v1::CaptureRequest,
    deadline: Duration,
    secret: &str,
    max_bytes: usize,
) -> Result<v1::CaptureResponse, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| format!("bad gRPC address `{address}`: {e}"))?
        .connect_timeout(Duration::from_secs(3).min(deadline));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {secret}")
        .parse()
        .map_err(|_| "the agent secret is not a valid header value".to_owned())?;
    let mut client = v1::node_agent_client::NodeAgentClient::with_interceptor(
        channel,
        move |mut req: tonic::Request<()>| {
            req.metadata_mut().insert("authorization", auth.clone());
            Ok(req)
        },
    )
    .max_decoding_message_size(max_bytes);
    let mut req = tonic::Request::new(request);
    req.set_timeout(deadline);
    client
        .capture(req)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| match s.code() {
            // The agent saw its grpc-timeout pass: the same outcome as ours.
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => timed_out(deadline),
            code => format!(
                "Capture failed: {} ({code:?})",
                super::merge::bounded(s.message())
            ),
        })
}

/// The reason of an agent that did not answer in time.
pub fn timed_out(deadline: Duration) -> String {
    format!(
        "did not answer within {:.1} s (duration + slack)",
        deadline.as_secs_f64()
    )
}
