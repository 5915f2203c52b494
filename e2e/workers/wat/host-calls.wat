;; A host-call-heavy worker: every request makes 100,000 calls of the
;; `edgeprof.log` import (the host keeps the first 1000 lines and drops the
;; rest), with a little wasm work between calls. The CPU profile's sample
;; count must follow the sampling interval, not the number of host calls.
(module
  (import "edgeprof" "log" (func $log (param i32 i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (data (i32.const 16) "tick")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param $len i32) (result i32) (i32.const 1024))
  (func $mix (param $n i32) (local $i i32) (local $x i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (global.set $sink (i32.add (global.get $sink) (local.get $x))))
  (func $chatty (local $n i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $n) (i32.const 100000)))
        (call $log (i32.const 16) (i32.const 4))
        (call $mix (i32.const 50))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br $l))))
  (func (export "edgeprof_handle") (param $ptr i32) (param $len i32) (result i64)
    (call $chatty)
    (i64.const 12)))
