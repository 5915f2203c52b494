;; The guest ABI by hand: a worker in WAT. Every request burns CPU in two
;; functions, 75 % in $hot and 25 % in $cold by construction, then answers
;; 200 with an empty body (the response bytes sit at offset 0).
(module
  (memory (export "memory") 2)
  (data (i32.const 0) "\c8\00\00\00\00\00\00\00\00\00\00\00")
  (global $sink (mut i32) (i32.const 0))
  (func (export "edgeprof_alloc") (param $len i32) (result i32) (i32.const 1024))
  (func $spin (param $n i32) (local $i i32) (local $x i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 31)) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    (global.set $sink (i32.add (global.get $sink) (local.get $x))))
  (func $hot (call $spin (i32.const 3000000)))
  (func $cold (call $spin (i32.const 1000000)))
  (func (export "edgeprof_handle") (param $ptr i32) (param $len i32) (result i64)
    (call $hot) (call $cold)
    (i64.const 12)))
