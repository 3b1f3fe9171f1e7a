package main

// rrperf: the bench's own request/response tool, run inside a namespace as
// `BENCH rrperf ...` (the bench binary re-executed). Debian has no netperf
// and neither sockperf nor qperf opens a new connection per transaction
// (netperf's TCP_CRR, the paper's connection setup test, §6.3), so the
// bench measures both with one small program whose every step is known:
//
//	rrperf -s -p PORT                   echo server: every connection, every byte back
//	rrperf -mode rr  -c HOST -p PORT -t SECS   transactions/s on one connection (1 B each way, like TCP_RR)
//	rrperf -mode crr -c HOST -p PORT -t SECS   connections/s, each connect, 1 B each way, close (TCP_CRR)
//	rrperf -s -close-first -p PORT      server that answers once and closes (as an HTTP server does)
//	rrperf -mode cps -c HOST -p PORT -t SECS   connections/s against it: connect, 1 B each way, the
//	                                           server's FIN, close; a failed one is counted, not an end
//	rrperf -mode hold -c HOST -p PORT -n N     opens N connections and keeps them; on stdin
//	                                           "check" echoes 1 B on each, "quit" ends
//
// rr, crr and cps print one JSON line (rrResult). The client closes first in crr
// (as netperf does), so its TIME_WAITs need tcp_tw_reuse in its namespace
// for a test of seconds at thousands of connections a second. In cps the
// server closes first, as a web server answering a request does, so the
// TIME_WAITs are the server's; and cps goes on past a failed connection
// (a refused or unanswered SYN, counted in errors), so its figure is the
// rate of connections completed whatever some of them met.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

// rrperfArg is the first argument that makes the bench binary rrperf.
const rrperfArg = "rrperf"

// rrPort is where rrperf servers listen (iperf3 has 5201); cpsPort is
// where the close-first one does.
const (
	rrPort  = "5202"
	cpsPort = "5203"
)

// rrResult is what rr and crr print.
type rrResult struct {
	Mode    string  `json:"mode"`
	Count   int     `json:"count"` // transactions (rr) or connections (crr, cps)
	Seconds float64 `json:"seconds"`
	Errors  int     `json:"errors"`
	Err     string  `json:"err,omitempty"` // the first error
}

// rrperfMain runs rrperf with args (after "rrperf") and returns the exit code.
func rrperfMain(args []string) int {
	fs := flag.NewFlagSet("rrperf", flag.ContinueOnError)
	server := fs.Bool("s", false, "serve: echo every byte of every connection")
	mode := fs.String("mode", "rr", "client mode: rr, crr, cps or hold")
	closeFirst := fs.Bool("close-first", false, "serve: answer the first bytes of a connection, then close it (cps)")
	host := fs.String("c", "", "server address (client modes)")
	port := fs.String("p", rrPort, "server port")
	secs := fs.Float64("t", 3, "test length in seconds (rr, crr, cps)")
	n := fs.Int("n", 1, "connections to hold (hold)")
	keepalive := fs.Duration("keepalive", -1, "TCP keepalive period of every connection (server and clients): 0 is Go's default (15 s), negative is none")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Thousands of connections need as many descriptors: one each, and
	// some to spare.
	if err := raiseNoFile(uint64(*n + 512)); err != nil {
		fmt.Fprintln(os.Stderr, "rrperf:", err)
		return 1
	}
	var err error
	switch {
	case *server:
		err = rrServe(":"+*port, *keepalive, *closeFirst)
	case *host == "":
		err = errors.New("-c HOST or -s")
	case *mode == "hold":
		err = rrHold(net.JoinHostPort(*host, *port), *n, *keepalive, os.Stdin, os.Stdout)
	case *mode == "rr" || *mode == "crr" || *mode == "cps":
		r := rrClient(*mode, net.JoinHostPort(*host, *port), time.Duration(*secs*float64(time.Second)))
		err = json.NewEncoder(os.Stdout).Encode(r)
	default:
		err = fmt.Errorf("-mode %q: want rr, crr, cps or hold", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rrperf:", err)
		return 1
	}
	return 0
}

func raiseNoFile(want uint64) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	if l.Cur >= want {
		return nil
	}
	// The soft limit up to the hard one is always allowed; beyond it
	// needs CAP_SYS_RESOURCE (root outside a container).
	hard := l.Max
	l.Cur = max(want, l.Cur)
	l.Max = max(want, l.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err == nil {
		return nil
	} else if hard < want {
		return fmt.Errorf("%d descriptors needed, the hard limit is %d and cannot be raised here: %w (raise it with ulimit -Hn)", want, hard, err)
	}
	l.Cur, l.Max = want, hard
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("raise the descriptor limit to %d: %w", want, err)
	}
	return nil
}

// rrServe echoes on addr; keepalive is the accepted connections' TCP
// keepalive period (negative: none, the request/response figures' choice:
// a probe is a packet the measurement did not ask for; 0: Go's default).
// closeFirst answers a connection's first bytes and closes it.
func rrServe(addr string, keepalive time.Duration, closeFirst bool) error {
	lc := net.ListenConfig{KeepAlive: keepalive}
	l, err := lc.Listen(context.Background(), "tcp4", addr)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 256)
			for {
				k, err := c.Read(buf)
				if err != nil {
					return
				}
				if _, err := c.Write(buf[:k]); err != nil || closeFirst {
					return
				}
			}
		}()
	}
}

// rrClient runs rr, crr or cps against addr for d.
func rrClient(mode, addr string, d time.Duration) rrResult {
	r := rrResult{Mode: mode}
	fail := func(err error) {
		r.Errors++
		if r.Err == "" {
			r.Err = err.Error()
		}
	}
	one := func(c net.Conn) error {
		var b [1]byte
		b[0] = 'x'
		if _, err := c.Write(b[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return err
		}
		return nil
	}
	dialer := net.Dialer{Timeout: 2 * time.Second}
	start := time.Now()
	end := start.Add(d)
	switch mode {
	case "rr":
		c, err := dialer.Dial("tcp4", addr)
		if err != nil {
			fail(err)
			break
		}
		c.SetDeadline(end.Add(5 * time.Second)) //nolint:errcheck // a fresh socket
		for time.Now().Before(end) {
			if err := one(c); err != nil {
				fail(err)
				break
			}
			r.Count++
		}
		c.Close()
	case "cps":
		// A dial of its own timeout: a SYN a full slice drops is a
		// failure to count after the first retransmission, not a stall.
		short := net.Dialer{Timeout: time.Second}
		for time.Now().Before(end) {
			c, err := short.Dial("tcp4", addr)
			if err != nil {
				fail(err)
				continue
			}
			c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a fresh socket
			if err = one(c); err == nil {
				// The server's FIN: EOF, and nothing else.
				var b [1]byte
				if k, rerr := c.Read(b[:]); k != 0 || !errors.Is(rerr, io.EOF) {
					err = fmt.Errorf("after the answer: %d bytes, %v, want the server's close", k, rerr)
				}
			}
			c.Close()
			if err != nil {
				fail(err)
				continue
			}
			r.Count++
		}
	case "crr":
		for time.Now().Before(end) {
			c, err := dialer.Dial("tcp4", addr)
			if err != nil {
				fail(err)
				break
			}
			c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a fresh socket
			err = one(c)
			c.Close()
			if err != nil {
				fail(err)
				break
			}
			r.Count++
		}
	}
	r.Seconds = time.Since(start).Seconds()
	return r
}

// rrHold opens n connections to addr, says "ready N", then answers
// commands on in: "check" (1 B echoed on every connection: "ok N" or
// "fail I: ERR"), "quit".
func rrHold(addr string, n int, keepalive time.Duration, in io.Reader, out io.Writer) error {
	dialer := net.Dialer{Timeout: 5 * time.Second, KeepAlive: keepalive} // see rrServe
	cs := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := dialer.Dial("tcp4", addr)
		if err != nil {
			return fmt.Errorf("connection %d of %d: %w", i+1, n, err)
		}
		cs = append(cs, c)
	}
	fmt.Fprintf(out, "ready %d\n", len(cs))
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "quit":
			return nil
		case "check":
			deadline := time.Now().Add(15 * time.Second)
			bad := -1
			var berr error
			for i, c := range cs {
				c.SetDeadline(deadline) //nolint:errcheck // an open socket
				b := []byte{byte(i)}
				if _, err := c.Write(b); err != nil {
					bad, berr = i, err
					break
				}
				if _, err := io.ReadFull(c, b); err != nil || b[0] != byte(i) {
					bad, berr = i, err
					if err == nil {
						berr = fmt.Errorf("echo %d, want %d", b[0], byte(i))
					}
					break
				}
			}
			if bad >= 0 {
				fmt.Fprintf(out, "fail %d: %v\n", bad, berr)
			} else {
				fmt.Fprintf(out, "ok %d\n", len(cs))
			}
		default:
			fmt.Fprintf(out, "unknown command %q\n", sc.Text())
		}
	}
	return sc.Err()
}

// ParseRR reads rrperf's line: the rate (per second) and the counts.
func ParseRR(out []byte) (Measurement, error) {
	var r rrResult
	if err := json.Unmarshal(out, &r); err != nil {
		return Measurement{}, fmt.Errorf("rrperf output %.200q: %w", out, err)
	}
	if r.Errors > 0 {
		return Measurement{}, fmt.Errorf("rrperf %s: %d error(s), the first: %s (after %d)", r.Mode, r.Errors, r.Err, r.Count)
	}
	if r.Count == 0 || r.Seconds <= 0 {
		return Measurement{}, fmt.Errorf("rrperf %s: nothing done in %.1f s", r.Mode, r.Seconds)
	}
	return Measurement{Value: float64(r.Count) / r.Seconds,
		Extra: map[string]float64{"count": float64(r.Count), "seconds": r.Seconds}}, nil
}

// ParseCPS reads rrperf's cps line: the rate of connections completed
// (per second), with the failed ones beside it ("failed"): a failure is
// part of what is measured, not a broken run, unless nothing completed.
func ParseCPS(out []byte) (Measurement, error) {
	var r rrResult
	if err := json.Unmarshal(out, &r); err != nil {
		return Measurement{}, fmt.Errorf("rrperf output %.200q: %w", out, err)
	}
	if r.Count == 0 || r.Seconds <= 0 {
		return Measurement{}, fmt.Errorf("rrperf %s: no connection completed in %.1f s (%d failed, the first: %s)", r.Mode, r.Seconds, r.Errors, r.Err)
	}
	return Measurement{Value: float64(r.Count) / r.Seconds,
		Extra: map[string]float64{"count": float64(r.Count), "seconds": r.Seconds, "failed": float64(r.Errors)}}, nil
}

// Request/response is one packet in flight: its rate is set by how fast
// the two ends wake each other, which depends on whether the scheduler has
// them on one CPU or two. Left to it, every variant's samples were bimodal
// (13-19k or 27-52k transactions a second, a variant translating nothing
// included), so medians compared how often each landed in the fast mode.
// Client and server are pinned to two CPUs in every variant alike.
const (
	rrClientCPU = 0
	rrServerCPU = 1
)

// pinned runs argv on one CPU (taskset: affinity set before exec, so every
// thread of a Go program inherits it).
func pinned(cpu int, argv []string) []string {
	return append([]string{"taskset", "-c", strconv.Itoa(cpu)}, argv...)
}

// rrperfArgv is the command line that runs rrperf inside a namespace.
func rrperfArgv(args ...string) ([]string, error) { return helperArgv(rrperfArg, args...) }

// rrServerKey is an rrperf server's key among Env.servers (iperf3's is
// Pair.Server itself).
func rrServerKey(p *Pair) string { return p.Server + " rrperf" }

// cpsServerKey is the close-first rrperf server's key among Env.servers.
func cpsServerKey(p *Pair) string { return p.Server + " rrperf close-first" }

// startCPSServer runs the close-first rrperf server in p's receiver for
// the whole run, pinned as the echo one is.
func (e *Env) startCPSServer(ctx context.Context, p *Pair) error {
	argv, err := rrperfArgv("-s", "-close-first", "-p", cpsPort)
	if err != nil {
		return err
	}
	return e.startListener(ctx, p, cpsServerKey(p), cpsPort, pinned(rrServerCPU, argv))
}

// startRRServer runs one rrperf server in p's receiver for the whole run,
// beside its iperf3 server, and waits until it listens.
func (e *Env) startRRServer(ctx context.Context, p *Pair) error {
	argv, err := rrperfArgv("-s", "-p", rrPort)
	if err != nil {
		return err
	}
	return e.startListener(ctx, p, rrServerKey(p), rrPort, pinned(rrServerCPU, argv))
}

// serverFor is the server test talks to in p's receiver (nil for rtt).
func (e *Env) serverFor(p *Pair, test string) *server {
	switch test {
	case "rtt":
		return nil
	case "rr", "crr":
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.servers[rrServerKey(p)]
	case "cps":
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.servers[cpsServerKey(p)]
	}
	return e.serverOf(p)
}

// restartServer starts again the server test needs in p's receiver.
func (e *Env) restartServer(ctx context.Context, p *Pair, test string) error {
	if test == "rr" || test == "crr" {
		return e.startRRServer(ctx, p)
	}
	if test == "cps" {
		return e.startCPSServer(ctx, p)
	}
	return e.startServer(ctx, p)
}
