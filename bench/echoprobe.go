package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/netns"
)

// echoProbe sends ICMP echo requests from inside a namespace and waits for
// the first reply, from the bench's own process: a raw socket opened in the
// namespace keeps sending and receiving there from any thread, so it can
// be opened before what is timed starts, and no launcher (`ip netns exec
// ping`) is timed with it.
type echoProbe struct {
	fd  int
	id  uint16
	seq uint16
}

// openEchoProbe opens the probe's socket inside namespace ns.
func openEchoProbe(ns string) (*echoProbe, error) {
	p := &echoProbe{fd: -1, id: uint16(rand.Uint32())}
	var err error
	if p.fd, err = rawICMPIn(netns.Path(ns)); err != nil {
		return nil, fmt.Errorf("%s: raw ICMP socket: %w", ns, err)
	}
	return p, nil
}

// rawICMPIn opens a raw ICMP socket inside the namespace at path, on a
// locked thread that goes back to its own namespace afterwards and lives
// on. netns.Do throws its thread away instead, and that would kill the
// bench's long-lived children: Pdeathsig (command) fires when the thread
// that started a child exits, and any thread may have started one (an
// iperf3 server, the tap relay). Only a thread that cannot go back is
// thrown away.
func rawICMPIn(path string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, back, err := rawICMPOnThread(path)
		if back {
			runtime.UnlockOSThread()
		} // else the goroutine ends locked, and its thread with it
		res <- result{fd, err}
	}()
	r := <-res
	return r.fd, r.err
}

// rawICMPOnThread is rawICMPIn's work on the locked thread; back reports
// whether the thread is in its own namespace again.
func rawICMPOnThread(path string) (fd int, back bool, err error) {
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, true, err
	}
	defer unix.Close(self)
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, true, err
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return -1, true, fmt.Errorf("enter %s: %w", path, err)
	}
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
	if berr := unix.Setns(self, unix.CLONE_NEWNET); berr != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, false, fmt.Errorf("back from %s: %w", path, berr)
	}
	return fd, true, err
}

func (p *echoProbe) close() {
	if p != nil && p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
}

// echoRequest is ICMP echo request seq of id, checksummed (a raw socket
// sends the ICMP message as it is given).
func echoRequest(id, seq uint16) []byte {
	b := make([]byte, 16) // 8 B header, 8 B payload
	b[0] = 8              // echo request
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	copy(b[8:], "ohbench!")
	binary.BigEndian.PutUint16(b[2:], csum.Checksum(b))
	return b
}

// isEchoReply tells whether pkt (an IPv4 packet, as a raw socket reads it)
// is an echo reply of id from src.
func isEchoReply(pkt []byte, src netip.Addr, id uint16) bool {
	if len(pkt) < 20 || pkt[0]>>4 != 4 || pkt[9] != unix.IPPROTO_ICMP {
		return false
	}
	hl := int(pkt[0]&0x0f) * 4
	if len(pkt) < hl+8 || netip.AddrFrom4([4]byte(pkt[12:16])) != src {
		return false
	}
	icmp := pkt[hl:]
	return icmp[0] == 0 && icmp[1] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id
}

// firstReply sends an echo request to dst every millisecond until the
// first reply from dst arrives, and returns how many it sent; it fails
// after timeout. A send that fails (no route yet, neighbour unresolved) is
// retried on the next tick; the last such error is named on timeout.
func (p *echoProbe) firstReply(ctx context.Context, dst netip.Addr, timeout time.Duration) (int, error) {
	if !dst.Is4() {
		return 0, fmt.Errorf("echo probe: %s is not an IPv4 address", dst)
	}
	to := &unix.SockaddrInet4{Addr: dst.As4()}
	buf := make([]byte, 1500)
	deadline := time.Now().Add(timeout)
	sent := 0
	var sendErr error
	for {
		p.seq++
		if err := unix.Sendto(p.fd, echoRequest(p.id, p.seq), 0, to); err != nil {
			sendErr = err
		} else {
			sent++
		}
		tick := time.Now().Add(time.Millisecond)
		for {
			wait := time.Until(tick)
			if wait <= 0 {
				break
			}
			// poll's timeout is in whole milliseconds: at least 1.
			_, err := unix.Poll([]unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}, max(1, int(wait/time.Millisecond)))
			if err != nil && !errors.Is(err, unix.EINTR) {
				return sent, fmt.Errorf("echo probe: poll: %w", err)
			}
			for {
				n, _, err := unix.Recvfrom(p.fd, buf, 0)
				if err != nil {
					break // EAGAIN: nothing more queued
				}
				if isEchoReply(buf[:n], dst, p.id) {
					return sent, nil
				}
			}
		}
		if ctx.Err() != nil {
			return sent, context.Cause(ctx)
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("no echo reply from %s within %v (%d requests sent)", dst, timeout, sent)
			if sendErr != nil {
				msg += fmt.Sprintf("; the last send failed: %v", sendErr)
			}
			return sent, errors.New(msg)
		}
	}
}
