//! Profiles the tests look at, built with `ProfileBuilder` as the sampler
//! builds them.

use edgeprof_pprof::{LineSpec, MappingSpec, Profile, ProfileBuilder};

/// A CPU profile from folded stacks, one `root;caller;leaf VALUE` per line.
/// Function `f` lives in `src/f.rs` from line 1; every call is at line 10.
pub fn folded(text: &str) -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (stack, value) = line.rsplit_once(' ').expect("`stack value`");
        let value: i64 = value.parse().expect("value");
        let mut ids: Vec<u64> = stack
            .split(';')
            .map(|name| {
                let f = b.function(name, name, &format!("src/{name}.rs"), 1);
                b.location(
                    0,
                    0,
                    &[LineSpec {
                        function_id: f,
                        line: 10,
                        column: 0,
                    }],
                )
            })
            .collect();
        ids.reverse();
        b.add_sample(&ids, &[1, value], &[]);
    }
    b.build()
}

/// What one frame of a hand-written stack is.
#[derive(Clone, Copy)]
struct Call<'a> {
    function: &'a str,
    file: &'a str,
    line: i64,
}

fn call<'a>(function: &'a str, file: &'a str, line: i64) -> Call<'a> {
    Call {
        function,
        file,
        line,
    }
}

fn add(b: &mut ProfileBuilder, mapping: u64, stack: &[Call<'_>], values: &[i64]) {
    let mut ids: Vec<u64> = stack
        .iter()
        .map(|c| {
            let f = b.function(c.function, c.function, c.file, 1);
            let address = 0x1000 + (c.line as u64) * 16 + c.function.len() as u64;
            b.location(
                mapping,
                address,
                &[LineSpec {
                    function_id: f,
                    line: c.line,
                    column: 0,
                }],
            )
        })
        .collect();
    ids.reverse();
    b.add_sample(&ids, values, &[]);
}

fn module(b: &mut ProfileBuilder, name: &str) -> u64 {
    b.mapping(&MappingSpec {
        memory_start: 0,
        memory_limit: 0x10_0000,
        file_offset: 0,
        filename: name,
        build_id: "6a736f6e2d67617465776179",
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: false,
    })
}

/// A CPU capture of a json-gateway worker: parse, a self-recursive key
/// replacer, serialize, and the allocator under two of them. 1 ms per sample.
pub fn json_gateway_cpu() -> Profile {
    let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")]);
    b.period("cpu", "nanoseconds", 1_000_000);
    b.duration_nanos(10_000_000_000);
    let m = module(&mut b, "json_gateway.wasm");
    let dispatch = call("edgeprof_guest::dispatch", "guest-sdk/src/lib.rs", 88);
    let handle = |line| call("json_gateway::handle", "src/lib.rs", line);
    let from_slice = call("serde_json::de::from_slice", "serde_json/src/de.rs", 2612);
    let parse_object = call(
        "serde_json::de::Deserializer::parse_object",
        "serde_json/src/de.rs",
        1840,
    );
    let malloc = call("dlmalloc::malloc", "dlmalloc/src/dlmalloc.rs", 512);
    let replace = call("json_gateway::replace_keys", "src/replace.rs", 37);
    let push_str = call(
        "alloc::string::String::push_str",
        "alloc/src/string.rs",
        1120,
    );
    let to_vec = call("serde_json::ser::to_vec", "serde_json/src/ser.rs", 2180);
    let escape = call(
        "serde_json::ser::format_escaped_str",
        "serde_json/src/ser.rs",
        2049,
    );
    let log = call("json_gateway::log_request", "src/log.rs", 9);
    let metrics = call("json_gateway::metrics::record", "src/metrics.rs", 14);
    let ms = 1_000_000;
    let mut sample = |stack: &[Call<'_>], n: i64| add(&mut b, m, stack, &[n, n * ms]);

    sample(&[dispatch, handle(21), from_slice, parse_object], 180);
    sample(
        &[dispatch, handle(21), from_slice, parse_object, malloc],
        40,
    );
    // The replacer recurses once per nesting level of the document.
    for (depth, n) in [(1, 120), (2, 90), (3, 60), (4, 30)] {
        let mut stack = vec![dispatch, handle(24)];
        stack.extend(std::iter::repeat_n(replace, depth));
        sample(&stack, n / 3); // the replacer's own time
        stack.push(push_str);
        sample(&stack, n);
    }
    sample(&[dispatch, handle(27), to_vec, escape], 110);
    sample(&[dispatch, handle(27), to_vec, malloc], 25);
    sample(&[dispatch, handle(30), log], 4);
    sample(&[dispatch, handle(31), metrics], 3);
    sample(&[dispatch], 2);
    b.build()
}

/// `(function, file, line)`.
type Frame = (&'static str, &'static str, i64);

/// A heap capture of an image-resizing worker, with Go's four heap sample
/// types (`inuse_space` is the default).
pub fn image_resizer_heap() -> Profile {
    let mut b = ProfileBuilder::new(&[
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]);
    b.period("space", "bytes", 512 * 1024);
    b.default_sample_type("inuse_space");
    let m = module(&mut b, "image_resizer.wasm");
    let kib = 1024;
    let stacks: &[(&[Frame], [i64; 4])] = &[
        (
            &[
                ("edgeprof_guest::dispatch", "guest-sdk/src/lib.rs", 88),
                ("image_resizer::handle", "src/lib.rs", 15),
                (
                    "image::codecs::png::PngDecoder::read_image",
                    "image/src/codecs/png.rs",
                    301,
                ),
                (
                    "alloc::vec::Vec::with_capacity",
                    "alloc/src/vec/mod.rs",
                    480,
                ),
            ],
            [12, 12 * 2048 * kib, 4, 4 * 2048 * kib],
        ),
        (
            &[
                ("edgeprof_guest::dispatch", "guest-sdk/src/lib.rs", 88),
                ("image_resizer::handle", "src/lib.rs", 18),
                ("image_resizer::resize", "src/resize.rs", 40),
                (
                    "image::imageops::resize",
                    "image/src/imageops/sample.rs",
                    944,
                ),
                (
                    "alloc::vec::Vec::with_capacity",
                    "alloc/src/vec/mod.rs",
                    480,
                ),
            ],
            [30, 30 * 1024 * kib, 10, 10 * 1024 * kib],
        ),
        (
            &[
                ("edgeprof_guest::dispatch", "guest-sdk/src/lib.rs", 88),
                ("image_resizer::handle", "src/lib.rs", 18),
                ("image_resizer::resize", "src/resize.rs", 52),
                ("image_resizer::cache::insert", "src/cache.rs", 23),
                (
                    "hashbrown::raw::RawTable::reserve_rehash",
                    "hashbrown/src/raw/mod.rs",
                    1021,
                ),
            ],
            [6, 6 * 768 * kib, 6, 6 * 768 * kib],
        ),
        (
            &[
                ("edgeprof_guest::dispatch", "guest-sdk/src/lib.rs", 88),
                ("image_resizer::handle", "src/lib.rs", 21),
                (
                    "image::codecs::jpeg::JpegEncoder::encode",
                    "image/src/codecs/jpeg/encoder.rs",
                    662,
                ),
                ("alloc::vec::Vec::reserve", "alloc/src/vec/mod.rs", 910),
            ],
            [20, 20 * 512 * kib, 0, 0],
        ),
        (
            &[
                ("edgeprof_guest::dispatch", "guest-sdk/src/lib.rs", 88),
                ("edgeprof_guest::read_request", "guest-sdk/src/lib.rs", 61),
            ],
            [40, 40 * 64 * kib, 1, 64 * kib],
        ),
    ];
    for (stack, values) in stacks {
        let calls: Vec<Call<'_>> = stack
            .iter()
            .map(|&(f, file, line)| call(f, file, line))
            .collect();
        add(&mut b, m, &calls, values);
    }
    b.build()
}

/// [`json_gateway_cpu`] as a capture across an edge labels it: sample `i`
/// from data center `sjc`, `lhr` or `nrt` (`i % 3`) and machine `m{i % 2}`.
pub fn json_gateway_cpu_labelled() -> Profile {
    let mut p = json_gateway_cpu();
    let mut intern = |s: &str| -> i64 {
        if let Some(i) = p.string_table.iter().position(|t| t == s) {
            return i as i64;
        }
        p.string_table.push(s.to_owned());
        p.string_table.len() as i64 - 1
    };
    let keys = (intern("data_center"), intern("machine"));
    let dcs = [intern("sjc"), intern("lhr"), intern("nrt")];
    let machines = [intern("m0"), intern("m1")];
    for (i, s) in p.sample.iter_mut().enumerate() {
        s.label.push(edgeprof_pprof::Label {
            key: keys.0,
            str: dcs[i % 3],
            ..Default::default()
        });
        s.label.push(edgeprof_pprof::Label {
            key: keys.1,
            str: machines[i % 2],
            ..Default::default()
        });
    }
    p
}
