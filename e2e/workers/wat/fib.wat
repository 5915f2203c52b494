;; A CPU-bound worker with a deep, call-heavy stack: every request computes
;; fib(25) by naive recursion (about a quarter of a million calls), so the
;; epoch check at each function entry and a stack of ~25 frames per sample
;; are what it costs to be profiled.
(module
  (memory (export "memory") 2)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param $len i32) (result i32) (i32.const 1024))
  (func $fib (param $n i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
      (then (local.get $n))
      (else
        (i32.add
          (call $fib (i32.sub (local.get $n) (i32.const 1)))
          (call $fib (i32.sub (local.get $n) (i32.const 2)))))))
  (func (export "edgeprof_handle") (param $ptr i32) (param $len i32) (result i64)
    (global.set $sink (call $fib (i32.const 25)))
    (i64.const 12)))
