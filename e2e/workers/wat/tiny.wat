;; The simulated edge's worker (`edgeprof-node-agent --simulate-machines`,
;; `cargo xtask bench capture`): every request spins about a millisecond in
;; $work, so a capture of a second or two samples each machine's isolate
;; at a request or two a second, then answers 200 with an empty body.
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param $len i32) (result i32) (i32.const 1024))
  (func $work (local $i i32) (local $x i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (i32.const 600000)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (global.set $sink (i32.add (global.get $sink) (local.get $x))))
  (func (export "edgeprof_handle") (param $ptr i32) (param $len i32) (result i64)
    (call $work)
    (i64.const 12)))
