//! The request/response byte format of the guest ABI: little-endian `u32`
//! lengths before every string and byte string.

use std::fmt;

/// An HTTP request as the worker sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query, e.g. `/items?id=3`.
    pub path: String,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// The worker's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Bytes that are not a valid encoded request or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// What was being read, e.g. `header name`.
    pub field: &'static str,
    /// Byte offset where reading it failed.
    pub offset: usize,
    /// Why.
    pub reason: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}: {}", self.field, self.offset, self.reason)
    }
}

impl std::error::Error for DecodeError {}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_headers(out: &mut Vec<u8>, headers: &[(String, String)]) {
    out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (k, v) in headers {
        put_bytes(out, k.as_bytes());
        put_bytes(out, v.as_bytes());
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let end = self.pos + 4;
        let b = self.bytes.get(self.pos..end).ok_or(DecodeError {
            field,
            offset: self.pos,
            reason: "truncated",
        })?;
        self.pos = end;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u32(field)? as usize;
        let start = self.pos;
        let b = start
            .checked_add(len)
            .and_then(|end| self.bytes.get(start..end))
            .ok_or(DecodeError {
                field,
                offset: start,
                reason: "length runs past the end",
            })?;
        self.pos = start + len;
        Ok(b)
    }
    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let offset = self.pos;
        let b = self.bytes(field)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError {
            field,
            offset,
            reason: "not UTF-8",
        })
    }
    fn headers(&mut self) -> Result<Vec<(String, String)>, DecodeError> {
        let n = self.u32("header count")? as usize;
        let mut headers = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let k = self.string("header name")?;
            let v = self.string("header value")?;
            headers.push((k, v));
        }
        Ok(headers)
    }
    fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError {
                field: "end",
                offset: self.pos,
                reason: "trailing bytes",
            })
        }
    }
}

impl Request {
    /// A `GET` of `path` with no headers or body.
    pub fn get(path: &str) -> Self {
        Request {
            method: "GET".into(),
            path: path.into(),
            ..Default::default()
        }
    }

    /// The ABI encoding: method, path, headers, body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.path.len() + self.body.len());
        put_bytes(&mut out, self.method.as_bytes());
        put_bytes(&mut out, self.path.as_bytes());
        put_headers(&mut out, &self.headers);
        put_bytes(&mut out, &self.body);
        out
    }

    /// Parses [`Request::encode`]'s output.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { bytes, pos: 0 };
        let req = Request {
            method: r.string("method")?,
            path: r.string("path")?,
            headers: r.headers()?,
            body: r.bytes("body")?.to_vec(),
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// A response with this status and body and no headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// The ABI encoding: status as `u32`, headers, body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.body.len());
        out.extend_from_slice(&u32::from(self.status).to_le_bytes());
        put_headers(&mut out, &self.headers);
        put_bytes(&mut out, &self.body);
        out
    }

    /// Parses [`Response::encode`]'s output.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { bytes, pos: 0 };
        let status = r.u32("status")?;
        let status = u16::try_from(status).map_err(|_| DecodeError {
            field: "status",
            offset: 0,
            reason: "larger than 65535",
        })?;
        let resp = Response {
            status,
            headers: r.headers()?,
            body: r.bytes("body")?.to_vec(),
        };
        r.finish()?;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips() {
        let req = Request {
            method: "POST".into(),
            path: "/a?b=c".into(),
            headers: vec![("x-id".into(), "7".into())],
            body: b"hello".to_vec(),
        };
        assert_eq!(Request::decode(&req.encode()).unwrap(), req);
    }

    #[test]
    fn response_round_trips() {
        let mut resp = Response::new(404, "nope");
        resp.headers
            .push(("content-type".into(), "text/plain".into()));
        assert_eq!(Response::decode(&resp.encode()).unwrap(), resp);
    }

    #[test]
    fn truncated_input_names_the_field() {
        let bytes = Request::get("/x").encode();
        let err = Request::decode(&bytes[..bytes.len() - 2]).unwrap_err();
        assert_eq!(err.to_string(), "body at byte 17: truncated");
        let err = Response::decode(&[200, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0]).unwrap_err();
        assert_eq!(err.field, "header name");
        assert_eq!(err.reason, "length runs past the end");
    }
}
