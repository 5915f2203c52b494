//! Malformed input, one case per way a file can be broken: each must give
//! its own specific error, and none may panic.

use edgeprof_pprof::{Profile, decode, decode_with_limit, encode, encode_raw};

use crate::support::{Wire, gzip, small_cpu};

/// Decodes `input` and asserts it fails with a message containing `expected`.
#[track_caller]
fn check(input: &[u8], expected: &str) {
    check_limit(input, edgeprof_pprof::DEFAULT_MAX_DECODED_BYTES, expected);
}

#[track_caller]
fn check_limit(input: &[u8], limit: u64, expected: &str) {
    match decode_with_limit(input, limit) {
        Ok(p) => panic!(
            "expected an error containing {expected:?}, but it decoded ({} samples)",
            p.sample.len()
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(expected),
                "error {msg:?} does not contain {expected:?}"
            );
        }
    }
}

/// `small_cpu()` changed by `edit`, as raw protobuf.
fn edited(edit: impl FnOnce(&mut Profile)) -> Vec<u8> {
    let mut p = small_cpu();
    edit(&mut p);
    encode_raw(&p)
}

#[test]
fn the_valid_base_case_decodes() {
    // Every case below breaks this one profile in one way.
    let p = small_cpu();
    assert_eq!(decode(&encode(&p)).unwrap(), p);
    assert_eq!(decode(&encode_raw(&p)).unwrap(), p);
}

#[test]
fn container_errors() {
    let good = encode(&small_cpu());
    check(b"", "empty input");
    check(&good[..good.len() / 2], "bad gzip data");
    check(&good[..12], "bad gzip data");
    // Gzip magic, then garbage.
    check(&[0x1f, 0x8b, 0xff, 0xff, 0xff, 0xff], "bad gzip data");
    // A valid gzip stream whose checksum is wrong.
    let mut bad_crc = good.clone();
    let n = bad_crc.len();
    bad_crc[n - 8] ^= 0xff;
    check(&bad_crc, "bad gzip data");
    // Valid gzip of something that is not a profile.
    check(&gzip(b"hello, world"), "not a pprof protobuf");
}

#[test]
fn gzip_bomb_stops_at_the_limit() {
    // 64 MiB of zeros compress to ~64 KiB; the limit is 1 MiB.
    let bomb = gzip(&vec![0u8; 64 << 20]);
    assert!(bomb.len() < 1 << 20);
    check_limit(
        &bomb,
        1 << 20,
        "decompressed profile exceeds the limit of 1048576 bytes",
    );
    // Raw input over the limit is refused the same way.
    check_limit(&vec![0u8; 4096], 1024, "exceeds the limit of 1024 bytes");
    // Exactly at the limit is fine.
    let raw = encode_raw(&small_cpu());
    decode_with_limit(&gzip(&raw), raw.len() as u64).unwrap();
}

#[test]
fn protobuf_errors() {
    let raw = encode_raw(&small_cpu());
    check(&raw[..raw.len() - 3], "not a pprof protobuf");
    // The message names the field where decoding stopped.
    check(&raw[..raw.len() - 3], "Profile.");
    // Wrong wire types: sample_type (a message) as a varint; string_table as
    // a fixed64.
    check(&Wire::default().int(1, 5).0, "invalid wire type");
    check(
        &Wire::default()
            .key(6, 1)
            .0
            .iter()
            .chain(&[0; 8])
            .copied()
            .collect::<Vec<_>>(),
        "invalid wire type",
    );
    // Wire type 7 does not exist.
    check(&Wire::default().key(2, 7).0, "invalid wire type value: 7");
    // A length far beyond the input (a huge count of bytes that is not there).
    check(
        &Wire::default().key(6, 2).varint(1 << 62).0,
        "buffer underflow",
    );
    // A varint longer than 10 bytes.
    check(
        &Wire::default()
            .key(9, 0)
            .0
            .iter()
            .chain(&[0xff; 11])
            .copied()
            .collect::<Vec<_>>(),
        "invalid varint",
    );
    // Field number 0 is reserved.
    check(&[0x00, 0x01], "invalid tag value: 0");
    // Strings must be UTF-8.
    check(
        &Wire::default().bytes(6, b"").bytes(6, b"\xff\xfe").0,
        "not UTF-8",
    );
    // A sample whose packed location ids end mid-varint.
    check(
        &Wire::default()
            .bytes(6, b"")
            .msg(2, Wire::default().bytes(1, &[0x80]))
            .0,
        "not a pprof protobuf",
    );
}

#[test]
fn string_table_errors() {
    check(
        &Wire::default().int(9, 1).0,
        "string_table[0] must be \"\" (found None)",
    );
    check(
        &Wire::default().bytes(6, b"x").0,
        "string_table[0] must be \"\" (found Some(\"x\"))",
    );
    let len = small_cpu().string_table.len();
    let out_of_range =
        format!("string index {len} is out of range (string_table has {len} entries)");
    type Edit = Box<dyn Fn(&mut Profile)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "sample_type[1].unit",
            Box::new(move |p| p.sample_type[1].unit = len as i64),
        ),
        (
            "period_type.type",
            Box::new(move |p| p.period_type.as_mut().unwrap().r#type = len as i64),
        ),
        (
            "function[2].name",
            Box::new(move |p| p.function[2].name = len as i64),
        ),
        (
            "function[0].filename",
            Box::new(move |p| p.function[0].filename = len as i64),
        ),
        (
            "mapping[0].build_id",
            Box::new(move |p| p.mapping[0].build_id = len as i64),
        ),
        (
            "sample[0].label[0].str",
            Box::new(move |p| p.sample[0].label[0].str = len as i64),
        ),
        ("drop_frames", Box::new(move |p| p.drop_frames = len as i64)),
        ("comment[0]", Box::new(move |p| p.comment.push(len as i64))),
        (
            "default_sample_type",
            Box::new(move |p| p.default_sample_type = len as i64),
        ),
    ];
    for (field, edit) in cases {
        check(&edited(edit), &format!("{field}: {out_of_range}"));
    }
    check(
        &edited(|p| p.function[1].system_name = -1),
        "function[1].system_name: string index -1 is out of range",
    );
    check(
        &edited(|p| p.sample[0].label[0].key = i64::MAX),
        "sample[0].label[0].key: string index 9223372036854775807 is out of range",
    );
}

#[test]
fn id_errors() {
    check(
        &edited(|p| p.mapping[0].id = 0),
        "mapping[0] has id 0; mapping ids start at 1",
    );
    check(
        &edited(|p| p.function[3].id = 0),
        "function[3] has id 0; function ids start at 1",
    );
    check(
        &edited(|p| p.location[1].id = 0),
        "location[1] has id 0; location ids start at 1",
    );
    check(
        &edited(|p| p.function[1].id = 1),
        "function id 1 is used more than once",
    );
    check(
        &edited(|p| p.location[3].id = 3),
        "location id 3 is used more than once",
    );
    check(
        &edited(|p| p.mapping.push(p.mapping[0])),
        "mapping id 1 is used more than once",
    );
    check(
        &edited(|p| p.sample[1].location_id[0] = 99),
        "sample[1].location_id[0]: refers to location id 99, which does not exist",
    );
    check(
        &edited(|p| p.location[2].line[0].function_id = u64::MAX),
        "location[2].line[0].function_id: refers to function id 18446744073709551615, which does not exist",
    );
    check(
        &edited(|p| p.location[0].mapping_id = 7),
        "location[0].mapping_id: refers to mapping id 7, which does not exist",
    );
    // A line without a function (id 0) is dangling too.
    check(
        &edited(|p| p.location[0].line[0].function_id = 0),
        "location[0].line[0].function_id: refers to function id 0",
    );
}

#[test]
fn value_count_errors() {
    check(
        &edited(|p| p.sample[1].value.push(7)),
        "sample[1] has 3 values but the profile has 2 sample types",
    );
    check(
        &edited(|p| p.sample[0].value.clear()),
        "sample[0] has 0 values but the profile has 2 sample types",
    );
    check(
        &edited(|p| p.sample_type.clear()),
        "sample[0] has 2 values but the profile has 0 sample types",
    );
}

#[test]
fn huge_values_do_not_overflow_reports() {
    // Valid but extreme: values at i64 limits must saturate, not panic.
    let p = edgeprof_pprof::decode(&edited(|p| {
        p.sample[0].value = vec![i64::MAX, i64::MIN];
        p.sample[1].value = vec![i64::MAX, i64::MIN];
    }))
    .unwrap();
    for index in ["samples", "cpu"] {
        let options = edgeprof_pprof::TopOptions {
            sample_index: Some(index.parse().unwrap()),
            ..Default::default()
        };
        let report = edgeprof_pprof::top(&p, &options).unwrap();
        assert_eq!(report.total, i64::MAX, "{index}");
        edgeprof_pprof::collapse(&p, options.sample_index.as_ref()).unwrap();
    }
    let merged = edgeprof_pprof::merge([&p, &p]).unwrap();
    assert_eq!(merged.sample[0].value, vec![i64::MAX, i64::MIN]);
    edgeprof_pprof::scale(&p, 1e300);
    edgeprof_pprof::scale(&p, f64::NAN);
}
