// Package accepttest floods a daemon's accept loop until the process runs
// out of descriptors for real (RLIMIT_NOFILE lowered in a child process),
// then lets the flood go and checks that the loop serves again: the test
// of issue 20's "a descriptor flood stops a daemon for good".
//
// A test calls FloodAndRecover; the test binary runs the same test again
// as the child (IsChild), whose test body calls ServeChild with the accept
// loop under test.
package accepttest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

const childEnv = "ONEHOP_ACCEPTTEST_CHILD"

// Spare is how many descriptors the child may open beyond those open when
// it starts serving: the flood takes them, and accept fails with EMFILE.
// It is below every per-source cap the daemons use, so the flood (from one
// loopback address) reaches the descriptor limit, not a cap.
const Spare = 12

// Flood is how many idle connections the flood opens: well past Spare,
// within the listen backlog.
const Flood = 200

// IsChild says whether this process is the child FloodAndRecover started.
func IsChild() bool { return os.Getenv(childEnv) == "1" }

// spy counts the EMFILE its listener's Accept returned: seen by the test,
// whatever the loop under test does with it.
type spy struct {
	net.Listener
	emfile atomic.Int64
}

func (s *spy) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if errors.Is(err, syscall.EMFILE) {
		s.emfile.Add(1)
	}
	return c, err
}

// ChildFail ends the child, saying why on stderr.
func ChildFail(err error) {
	fmt.Fprintln(os.Stderr, "accepttest child:", err)
	os.Exit(2)
}

// ServeChild is the child's body: it listens on loopback, lowers the
// descriptor limit to what is open plus Spare, says its address, and runs
// serve on the listener (serve returning is fine: that is the defect). It
// answers "emfile" on stdin with the EMFILE accept saw so far, and exits
// when stdin ends. Never returns.
func ServeChild(serve func(net.Listener)) {
	nl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		ChildFail(err)
	}
	l := &spy{Listener: nl}
	if err := limitDescriptors(Spare); err != nil {
		ChildFail(err)
	}
	fmt.Printf("listen %s\n", nl.Addr())
	go serve(l)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "emfile" {
			fmt.Printf("emfile %d\n", l.emfile.Load())
		}
	}
	os.Exit(0)
}

// limitDescriptors sets RLIMIT_NOFILE's soft limit to the descriptors open
// now plus spare.
func limitDescriptors(spare int) error {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = uint64(len(fds) + spare)
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// child is the running child process.
type child struct {
	addr string
	in   *os.File
	out  *bufio.Scanner
}

func (c *child) emfile(t *testing.T) int {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, "emfile"); err != nil {
		t.Fatalf("ask the child: %v", err)
	}
	if !c.out.Scan() {
		t.Fatalf("the child ended: %v", c.out.Err())
	}
	n, err := strconv.Atoi(strings.TrimPrefix(c.out.Text(), "emfile "))
	if err != nil {
		t.Fatalf("the child said %q", c.out.Text())
	}
	return n
}

// FloodAndRecover runs the test named name again as a child (whose body
// calls ServeChild) and proves its accept loop outlives a descriptor
// flood: exchange (one request and its answer on a fresh connection)
// works first (the control); then Flood idle connections exhaust the
// child's descriptors until accept has failed with EMFILE; then the flood
// goes away and exchange must work again.
func FloodAndRecover(t *testing.T, name string, exchange func(net.Conn) error) {
	t.Helper()
	stderr := &testenv.Buffer{}
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = stderr
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = inR
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the child: %v", err)
	}
	inR.Close()
	t.Cleanup(func() {
		inW.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }() //nolint:errcheck // killed if it does not end
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("child's stderr:\n%s", stderr)
		}
	})
	c := &child{in: inW, out: bufio.NewScanner(out)}
	if !c.out.Scan() {
		t.Fatalf("the child said nothing: %v", c.out.Err())
	}
	addr, ok := strings.CutPrefix(c.out.Text(), "listen ")
	if !ok {
		t.Fatalf("the child said %q, want its address", c.out.Text())
	}
	c.addr = addr

	try := func(what string) error {
		conn, err := net.DialTimeout("tcp4", c.addr, 10*time.Second)
		if err != nil {
			return fmt.Errorf("%s: dial: %w", what, err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // TCP takes deadlines
		if err := exchange(conn); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	if err := try("control, before the flood"); err != nil {
		t.Fatal(err)
	}

	var flood []net.Conn
	closeFlood := func() {
		for _, f := range flood {
			f.Close()
		}
		flood = nil
	}
	t.Cleanup(closeFlood)
	for i := range Flood {
		f, err := net.DialTimeout("tcp4", c.addr, 10*time.Second)
		if err != nil {
			t.Fatalf("flood connection %d: %v", i, err)
		}
		flood = append(flood, f)
	}
	testenv.Eventually(t, "the child's accept failing with EMFILE under the flood", 20*time.Second, func() bool { return c.emfile(t) > 0 })
	closeFlood()
	if err := try("after the flood went away"); err != nil {
		t.Fatalf("%v (the accept loop did not serve again after EMFILE; %d EMFILE seen)", err, c.emfile(t))
	}
}

// DialFrom connects to addr from the loopback address src (the whole of
// 127/8 is this host's: each address is a source of its own for the caps)
// and closes the connection when the test ends.
func DialFrom(t testing.TB, addr net.Addr, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp4", addr.String())
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
