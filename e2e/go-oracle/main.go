// Command go-oracle records real Go CPU and heap profiles with runtime/pprof,
// for edgeprof's interop tests against `go tool pprof`. Standard library only.
//
//	go-oracle cpu OUT.pprof [DURATION]   CPU profile of a busy workload (default 1500ms)
//	go-oracle heap OUT.pprof             heap profile, every allocation sampled
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"
)

var sink []byte
var sinkInt int
var keep [][]byte

// fib recurses, so its cum must be counted once per sample.
func fib(n int) int {
	if n < 2 {
		return n
	}
	return fib(n-1) + fib(n-2)
}

// mix is small enough to be inlined into its callers: inline frames.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

func hashLoop(n int) uint64 {
	var acc uint64
	for i := 0; i < n; i++ {
		acc += mix(uint64(i) + acc)
	}
	return acc
}

func sortish(n int) int {
	a := make([]int, n)
	for i := range a {
		a[i] = int(mix(uint64(i)) % 1000)
	}
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j-1] > a[j]; j-- {
			a[j-1], a[j] = a[j], a[j-1]
		}
	}
	return a[0]
}

func busyA(deadline time.Time) {
	for time.Now().Before(deadline) {
		sinkInt += fib(22)
	}
}

func busyB(deadline time.Time) {
	for time.Now().Before(deadline) {
		sinkInt += int(hashLoop(200000))
	}
}

func busyC(deadline time.Time) {
	for time.Now().Before(deadline) {
		sinkInt += sortish(1500)
	}
}

func cpu(out string, d time.Duration) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	start := time.Now()
	// Phases of different lengths so flat values differ.
	busyA(start.Add(d * 3 / 6))
	busyB(start.Add(d * 5 / 6))
	busyC(start.Add(d))
	pprof.StopCPUProfile()
	return nil
}

//go:noinline
func allocSmall(n int) {
	for i := 0; i < n; i++ {
		sink = make([]byte, 64)
	}
}

//go:noinline
func allocLarge(n int) {
	for i := 0; i < n; i++ {
		keep = append(keep, make([]byte, 32<<10))
	}
}

//go:noinline
func allocRecursive(depth int) {
	if depth == 0 {
		keep = append(keep, make([]byte, 4096))
		return
	}
	sink = make([]byte, 128*depth)
	allocRecursive(depth - 1)
}

func heap(out string) error {
	for i := 0; i < 200; i++ {
		allocSmall(50)
		allocRecursive(6)
	}
	allocLarge(300)
	runtime.GC()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}

func main() {
	// Sample every allocation so the heap profile is exact, and before any
	// allocation happens.
	runtime.MemProfileRate = 1
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go-oracle cpu|heap OUT [DURATION]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "cpu":
		d := 1500 * time.Millisecond
		if len(os.Args) > 3 {
			if d, err = time.ParseDuration(os.Args[3]); err != nil {
				break
			}
		}
		err = cpu(os.Args[2], d)
	case "heap":
		err = heap(os.Args[2])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-oracle:", err)
		os.Exit(1)
	}
}
