;; gzip: compresses the input on its way out into a gzip stream (RFC 1952) that
;; `gzip -d` and `curl --compressed` decode. Deflate (RFC 1951) with LZ77 (hash of 3
;; bytes, one candidate, greedy, 32 KiB window across buffers) and the fixed Huffman
;; code, as one final block; CRC-32 and length in the trailer.
;;
;; Properties:
;;   http          (optional) if present, an HTTP/1.1 200 header goes first
;;                 (Content-Encoding: gzip, Connection: close: the body ends at close)
;;   content-type  (optional, with http) default application/octet-stream
;; Input: the data to compress, in buffers of any size (fed with on_data).
;; on_close ends the stream.
;;
;; Memory map:
;;   0x00000  CRC-32 table, 256 x i32
;;   0x00400  literal/length codes, 288 x i32: bit-reversed code | length << 16
;;   0x00900  distance codes, 30 x i32: bit-reversed 5-bit code
;;   0x00a00  strings
;;   0x01000  scratch: the header
;;   0x10000  hash table, 16384 x i32: absolute position of the last 3-byte string
;;   0x20000  window: up to 32 KiB of history ending at 0x28000, then the chunk
;;   0x30000  output, 64 KiB
(module
  (import "ferry" "prop" (func $prop (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_read" (func $buf_read (param i32 i32 i32 i32) (result i32)))
  (import "ferry" "buf_new" (func $buf_new (param i32 i32) (result i32)))
  (import "ferry" "buf_drop" (func $buf_drop (param i32) (result i32)))
  (import "ferry" "emit" (func $emit (param i32) (result i32)))

  (memory (export "memory") 4)

  (data (i32.const 0x0a00) "http")                                        ;; 4
  (data (i32.const 0x0a10) "content-type")                                ;; 12
  (data (i32.const 0x0a20) "HTTP/1.1 200 OK\0d\0aContent-Encoding: gzip\0d\0aConnection: close\0d\0aContent-Type: ") ;; 74
  (data (i32.const 0x0a80) "application/octet-stream")                    ;; 24
  (data (i32.const 0x0aa0) "\0d\0a\0d\0a")                                   ;; 4
  (data (i32.const 0x0ab0) "\1f\8b\08\00\00\00\00\00\00\03")                 ;; 10: gzip header

  (global $CRCT i32 (i32.const 0x00000))
  (global $LIT i32 (i32.const 0x00400))
  (global $DIST i32 (i32.const 0x00900))
  (global $SCRATCH i32 (i32.const 0x01000))
  (global $HASH i32 (i32.const 0x10000))
  (global $WIN i32 (i32.const 0x20000))
  (global $CHUNK i32 (i32.const 0x28000))
  (global $CHUNK_MAX i32 (i32.const 0x8000))
  (global $OUT i32 (i32.const 0x30000))

  (global $bitbuf (mut i64) (i64.const 0))
  (global $bitcnt (mut i32) (i32.const 0))
  (global $out (mut i32) (i32.const 0x30000))
  (global $crc (mut i32) (i32.const -1))
  (global $isize (mut i32) (i32.const 0))
  (global $shift (mut i32) (i32.const 0))
  (global $hist (mut i32) (i32.const 0))

  ;; Reverses the low $n bits of $v.
  (func $rev (param $v i32) (param $n i32) (result i32)
    (local $r i32)
    (block $done
      (loop $l
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $r (i32.or (i32.shl (local.get $r) (i32.const 1))
                              (i32.and (local.get $v) (i32.const 1))))
        (local.set $v (i32.shr_u (local.get $v) (i32.const 1)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $l)))
    (local.get $r))

  ;; Appends the low $n bits of $v (n <= 32) to the bit stream, LSB first.
  (func $bits (param $v i32) (param $n i32)
    (global.set $bitbuf (i64.or (global.get $bitbuf)
      (i64.shl (i64.extend_i32_u (local.get $v)) (i64.extend_i32_u (global.get $bitcnt)))))
    (global.set $bitcnt (i32.add (global.get $bitcnt) (local.get $n)))
    (if (i32.ge_u (global.get $bitcnt) (i32.const 32))
      (then
        (i32.store (global.get $out) (i32.wrap_i64 (global.get $bitbuf)))
        (global.set $out (i32.add (global.get $out) (i32.const 4)))
        (global.set $bitbuf (i64.shr_u (global.get $bitbuf) (i64.const 32)))
        (global.set $bitcnt (i32.sub (global.get $bitcnt) (i32.const 32))))))

  ;; Literal/length symbol $s with $en extra bits of value $ev.
  (func $sym (param $s i32) (param $ev i32) (param $en i32)
    (local $e i32) (local $n i32)
    (local.set $e (i32.load (i32.add (global.get $LIT) (i32.shl (local.get $s) (i32.const 2)))))
    (local.set $n (i32.shr_u (local.get $e) (i32.const 16)))
    (call $bits
      (i32.or (i32.and (local.get $e) (i32.const 0xffff))
              (i32.shl (local.get $ev) (local.get $n)))
      (i32.add (local.get $n) (local.get $en))))

  ;; A match of length $len (3..258) at distance $dist (1..32768).
  (func $match (param $len i32) (param $dist i32)
    (local $x i32) (local $nb i32) (local $en i32)
    (local.set $x (i32.sub (local.get $len) (i32.const 3)))
    (if (i32.eq (local.get $x) (i32.const 255))
      (then (call $sym (i32.const 285) (i32.const 0) (i32.const 0)))
      (else
        (if (i32.lt_u (local.get $x) (i32.const 8))
          (then (call $sym (i32.add (i32.const 257) (local.get $x)) (i32.const 0) (i32.const 0)))
          (else
            (local.set $nb (i32.sub (i32.const 31) (i32.clz (local.get $x))))
            (local.set $en (i32.sub (local.get $nb) (i32.const 2)))
            (call $sym
              (i32.add (i32.add (i32.const 257)
                                (i32.shl (i32.sub (local.get $nb) (i32.const 1)) (i32.const 2)))
                       (i32.and (i32.shr_u (local.get $x) (local.get $en)) (i32.const 3)))
              (i32.and (local.get $x) (i32.sub (i32.shl (i32.const 1) (local.get $en)) (i32.const 1)))
              (local.get $en))))))
    ;; distance
    (local.set $x (i32.sub (local.get $dist) (i32.const 1)))
    (if (i32.lt_u (local.get $x) (i32.const 4))
      (then
        (call $bits (i32.load (i32.add (global.get $DIST) (i32.shl (local.get $x) (i32.const 2))))
                    (i32.const 5)))
      (else
        (local.set $nb (i32.sub (i32.const 31) (i32.clz (local.get $x))))
        (local.set $en (i32.sub (local.get $nb) (i32.const 1)))
        (call $bits
          (i32.or
            (i32.load (i32.add (global.get $DIST)
              (i32.shl (i32.add (i32.shl (local.get $nb) (i32.const 1))
                                (i32.and (i32.shr_u (local.get $x) (local.get $en)) (i32.const 1)))
                       (i32.const 2))))
            (i32.shl (i32.and (local.get $x)
                              (i32.sub (i32.shl (i32.const 1) (local.get $en)) (i32.const 1)))
                     (i32.const 5)))
          (i32.add (i32.const 5) (local.get $en))))))

  ;; Sends the output area (whole 32-bit words written so far) as one buffer.
  (func $flush (result i32)
    (local $h i32)
    (if (i32.gt_u (global.get $out) (global.get $OUT))
      (then
        (local.set $h (call $buf_new (global.get $OUT) (i32.sub (global.get $out) (global.get $OUT))))
        (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
        (drop (call $emit (local.get $h)))
        (global.set $out (global.get $OUT))))
    (i32.const 0))

  ;; Hash slot address of the 3 bytes at $p.
  (func $slot (param $p i32) (result i32)
    (i32.add (global.get $HASH)
      (i32.shl
        (i32.shr_u (i32.mul (i32.and (i32.load (local.get $p)) (i32.const 0xffffff))
                            (i32.const 0x9e3779b1))
                   (i32.const 18))
        (i32.const 2))))

  ;; Compresses the $n bytes at $CHUNK (history before it).
  (func $compress (param $n i32)
    (local $p i32) (local $end i32) (local $lo i32) (local $i i32) (local $c i32)
    (local $crc i32) (local $slot i32) (local $cur i32) (local $dist i32) (local $cp i32)
    (local $max i32) (local $l i32) (local $j i32) (local $keep i32)
    ;; CRC-32 of the chunk
    (local.set $crc (global.get $crc))
    (local.set $p (global.get $CHUNK))
    (local.set $end (i32.add (global.get $CHUNK) (local.get $n)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
        (local.set $crc
          (i32.xor
            (i32.load (i32.shl (i32.and (i32.xor (local.get $crc) (i32.load8_u (local.get $p)))
                                        (i32.const 0xff))
                               (i32.const 2)))
            (i32.shr_u (local.get $crc) (i32.const 8))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $l)))
    (global.set $crc (local.get $crc))
    (global.set $isize (i32.add (global.get $isize) (local.get $n)))

    ;; LZ77, greedy
    (local.set $p (global.get $CHUNK))
    (local.set $lo (i32.sub (global.get $CHUNK) (global.get $hist)))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
        (block $literal
          (br_if $literal (i32.gt_u (i32.add (local.get $p) (i32.const 3)) (local.get $end)))
          (local.set $slot (call $slot (local.get $p)))
          (local.set $cur (i32.add (i32.sub (local.get $p) (global.get $WIN)) (global.get $shift)))
          (local.set $dist (i32.sub (local.get $cur) (i32.load (local.get $slot))))
          (i32.store (local.get $slot) (local.get $cur))
          ;; 1 <= dist <= 32768, and the candidate inside the window
          (br_if $literal (i32.ge_u (i32.sub (local.get $dist) (i32.const 1)) (i32.const 32768)))
          (local.set $cp (i32.sub (local.get $p) (local.get $dist)))
          (br_if $literal (i32.lt_u (local.get $cp) (local.get $lo)))
          (local.set $max (i32.sub (local.get $end) (local.get $p)))
          (if (i32.gt_u (local.get $max) (i32.const 258)) (then (local.set $max (i32.const 258))))
          (local.set $l (i32.const 0))
          (block $cmp_done
            (loop $cmp
              (br_if $cmp_done (i32.ge_u (local.get $l) (local.get $max)))
              (br_if $cmp_done
                (i32.ne (i32.load8_u (i32.add (local.get $cp) (local.get $l)))
                        (i32.load8_u (i32.add (local.get $p) (local.get $l)))))
              (local.set $l (i32.add (local.get $l) (i32.const 1)))
              (br $cmp)))
          (br_if $literal (i32.lt_u (local.get $l) (i32.const 3)))
          (call $match (local.get $l) (local.get $dist))
          ;; remember the strings inside the match too
          (local.set $j (i32.const 1))
          (block $ins_done
            (loop $ins
              (br_if $ins_done (i32.ge_u (local.get $j) (local.get $l)))
              (local.set $i (i32.add (local.get $p) (local.get $j)))
              (br_if $ins_done (i32.gt_u (i32.add (local.get $i) (i32.const 3)) (local.get $end)))
              (i32.store (call $slot (local.get $i))
                         (i32.add (i32.sub (local.get $i) (global.get $WIN)) (global.get $shift)))
              (local.set $j (i32.add (local.get $j) (i32.const 1)))
              (br $ins)))
          (local.set $p (i32.add (local.get $p) (local.get $l)))
          (br $next))
        ;; literal
        (call $sym (i32.load8_u (local.get $p)) (i32.const 0) (i32.const 0))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $next)))

    ;; Keep the last 32 KiB as history, ending at $CHUNK.
    (local.set $keep (i32.add (global.get $hist) (local.get $n)))
    (if (i32.gt_u (local.get $keep) (i32.const 32768)) (then (local.set $keep (i32.const 32768))))
    (memory.copy (i32.sub (global.get $CHUNK) (local.get $keep))
                 (i32.sub (local.get $end) (local.get $keep))
                 (local.get $keep))
    (global.set $hist (local.get $keep))
    (global.set $shift (i32.add (global.get $shift) (local.get $n))))

  (func (export "init") (result i32)
    (local $i i32) (local $c i32) (local $k i32) (local $code i32) (local $n i32)
    (local $p i32) (local $h i32)
    ;; CRC-32 table
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (i32.const 256)))
        (local.set $c (local.get $i))
        (local.set $k (i32.const 8))
        (loop $bit
          (local.set $c
            (if (result i32) (i32.and (local.get $c) (i32.const 1))
              (then (i32.xor (i32.const 0xedb88320) (i32.shr_u (local.get $c) (i32.const 1))))
              (else (i32.shr_u (local.get $c) (i32.const 1)))))
          (local.set $k (i32.sub (local.get $k) (i32.const 1)))
          (br_if $bit (local.get $k)))
        (i32.store (i32.add (global.get $CRCT) (i32.shl (local.get $i) (i32.const 2))) (local.get $c))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    ;; fixed literal/length code (RFC 1951 3.2.6)
    (local.set $i (i32.const 0))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (i32.const 288)))
        (if (i32.lt_u (local.get $i) (i32.const 144))
          (then (local.set $code (i32.add (i32.const 0x30) (local.get $i))) (local.set $n (i32.const 8)))
          (else (if (i32.lt_u (local.get $i) (i32.const 256))
            (then (local.set $code (i32.add (i32.const 0x190) (i32.sub (local.get $i) (i32.const 144))))
                  (local.set $n (i32.const 9)))
            (else (if (i32.lt_u (local.get $i) (i32.const 280))
              (then (local.set $code (i32.sub (local.get $i) (i32.const 256))) (local.set $n (i32.const 7)))
              (else (local.set $code (i32.add (i32.const 0xc0) (i32.sub (local.get $i) (i32.const 280))))
                    (local.set $n (i32.const 8))))))))
        (i32.store (i32.add (global.get $LIT) (i32.shl (local.get $i) (i32.const 2)))
                   (i32.or (call $rev (local.get $code) (local.get $n))
                           (i32.shl (local.get $n) (i32.const 16))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
    ;; fixed distance code: 5 bits
    (local.set $i (i32.const 0))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (i32.const 30)))
        (i32.store (i32.add (global.get $DIST) (i32.shl (local.get $i) (i32.const 2)))
                   (call $rev (local.get $i) (i32.const 5)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))

    ;; header: optional HTTP, then gzip's 10 bytes
    (local.set $p (global.get $SCRATCH))
    (if (i32.ge_s (call $prop (i32.const 0x0a00) (i32.const 4) (i32.const 0) (i32.const 0)) (i32.const 0))
      (then
        (memory.copy (local.get $p) (i32.const 0x0a20) (i32.const 74))
        (local.set $p (i32.add (local.get $p) (i32.const 74)))
        (local.set $n (call $prop (i32.const 0x0a10) (i32.const 12) (local.get $p) (i32.const 1024)))
        (if (i32.lt_s (local.get $n) (i32.const 0))
          (then (memory.copy (local.get $p) (i32.const 0x0a80) (i32.const 24))
                (local.set $n (i32.const 24))))
        (if (i32.gt_s (local.get $n) (i32.const 1024)) (then (return (i32.const -1))))
        (local.set $p (i32.add (local.get $p) (local.get $n)))
        (memory.copy (local.get $p) (i32.const 0x0aa0) (i32.const 4))
        (local.set $p (i32.add (local.get $p) (i32.const 4)))))
    (memory.copy (local.get $p) (i32.const 0x0ab0) (i32.const 10))
    (local.set $p (i32.add (local.get $p) (i32.const 10)))
    (local.set $h (call $buf_new (global.get $SCRATCH) (i32.sub (local.get $p) (global.get $SCRATCH))))
    (if (i32.lt_s (local.get $h) (i32.const 0)) (then (return (local.get $h))))
    (drop (call $emit (local.get $h)))
    ;; one final block, fixed Huffman: BFINAL=1, BTYPE=01
    (call $bits (i32.const 3) (i32.const 3))
    (i32.const 0))

  (func (export "on_data") (param $h i32) (result i32)
    (local $off i32) (local $n i32) (local $r i32)
    (block $done
      (loop $l
        (local.set $n (call $buf_read (local.get $h) (local.get $off) (global.get $CHUNK) (global.get $CHUNK_MAX)))
        (br_if $done (i32.le_s (local.get $n) (i32.const 0)))
        (call $compress (local.get $n))
        (local.set $r (call $flush))
        (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
        (local.set $off (i32.add (local.get $off) (local.get $n)))
        (br $l)))
    (drop (call $buf_drop (local.get $h)))
    (if (result i32) (i32.lt_s (local.get $n) (i32.const 0))
      (then (local.get $n))
      (else (i32.const 0))))

  (func (export "on_close") (result i32)
    (local $r i32)
    ;; end of block
    (call $sym (i32.const 256) (i32.const 0) (i32.const 0))
    ;; the last bits, padded to a byte
    (i64.store (global.get $out) (global.get $bitbuf))
    (global.set $out (i32.add (global.get $out)
                              (i32.shr_u (i32.add (global.get $bitcnt) (i32.const 7)) (i32.const 3))))
    (global.set $bitbuf (i64.const 0))
    (global.set $bitcnt (i32.const 0))
    ;; trailer: CRC-32, ISIZE (little-endian)
    (i32.store (global.get $out) (i32.xor (global.get $crc) (i32.const -1)))
    (i32.store (i32.add (global.get $out) (i32.const 4)) (global.get $isize))
    (global.set $out (i32.add (global.get $out) (i32.const 8)))
    (local.set $r (call $flush))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (i32.const 1))
)
