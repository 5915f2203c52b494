//! Any bytes through `decode` (gzip detection, size limit, protobuf,
//! validation): never a panic, and whatever decodes is safe to report on,
//! merge and re-encode, and round-trips.

#![no_main]

use edgeprof_pprof::{SampleIndex, TopOptions, collapse, decode, decode_with_limit, encode, top};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(profile) = decode_with_limit(data, 16 << 20) else {
        return;
    };
    for i in 0..profile.sample_type.len() {
        let index = SampleIndex::Position(i);
        let options = TopOptions {
            sample_index: Some(index.clone()),
            ..Default::default()
        };
        top(&profile, &options).expect("a sample index in range");
        collapse(&profile, Some(&index)).expect("a sample index in range");
    }
    let _ = edgeprof_pprof::merge([&profile, &profile]);
    let again = decode(&encode(&profile)).expect("an encoded valid profile decodes");
    assert_eq!(again, profile, "decode(encode(p)) == p");
});
