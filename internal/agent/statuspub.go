package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/onehop/onehop/internal/intent"
)

// StatusWritesPerSecond is what all agents together may write of status
// records per second when changes keep coming everywhere: an agent left to
// size its own pace (Config.StatusEvery 0) writes at most once per
// hosts/StatusWritesPerSecond seconds, within [MinStatusEvery,
// MaxStatusEvery]. A lab of three hosts then reports every 100 ms; a cloud
// of 1,000 every 5 s; 2,000 and more every 10 s, so beyond 2,000 hosts the
// cloud writes up to hosts/10 a second.
const StatusWritesPerSecond = 200

// StatusBytesPerSecond is what all agents together may write of status
// records per second, in bytes, when changes keep coming everywhere: a
// status lists a host's vifs, so it grows with the VMs the host carries
// (about 75 KiB at 2,000), and paced by count alone three lab hosts of
// 2,000 VMs each wrote 2 MiB a second into the controller's etcd while
// VMs were created, slowing the creates (issue 20, item 18). A self-sized
// pace is also at least hosts x the last status's size / this, which
// outweighs StatusWritesPerSecond only for a status over 2.6 KiB (a host of
// some 60 VMs and more).
const StatusBytesPerSecond = 512 << 10

// The bounds of a self-sized status pace.
const (
	MinStatusEvery = 100 * time.Millisecond
	MaxStatusEvery = 10 * time.Second
)

// Why the status is paced: an intent change that reaches a hundred hosts
// makes each of them apply it, and each then has a new applied revision to
// report. Written at once, those hundred writes queue in etcd ahead of the
// controller's next change, and every agent that reports slows the change
// after it for everyone (docs/control-plane.md, "Status writes are
// paced"). Paced, a host
// that sees many changes reports the latest of them once per interval; a
// host that was quiet still reports its first change at once, so a single
// change (a lab step, `onehop status` after an edit) is seen without delay.
// Measured at 1,000 hosts (docs/control-plane.md): written after every
// change, rule changes reached every host with p99 554 ms; at most once a
// second, about 110 ms; at most once per 5 s, 59 ms.

// statusEvery is the pace for a cloud of hosts hosts whose status is size
// bytes (Config.StatusEvery when set).
func statusEvery(set time.Duration, hosts, size int) time.Duration {
	if set > 0 {
		return set
	}
	every := max(time.Duration(hosts)*time.Second/StatusWritesPerSecond,
		time.Duration(hosts)*time.Duration(size)*time.Second/StatusBytesPerSecond)
	return min(max(every, MinStatusEvery), MaxStatusEvery)
}

// statusWriteTimeout bounds one status write: a stalled store delays the
// report, never the datapath.
const statusWriteTimeout = 5 * time.Second

// noteStatusLocked takes st as the agent's status to publish; a.mu must
// be held.
// It is written by the publisher (Run) or by flushStatus, never by the pass
// that made it.
func (a *Agent) noteStatusLocked(st intent.AgentStatus) {
	a.status = st
	a.statusSeq++
	select {
	case a.statusKick <- struct{}{}:
	default: // a kick is already pending: it will write the latest
	}
}

// flushStatus writes the latest status now if it has not been written.
// Every attempt, failed or not, starts a new interval.
func (a *Agent) flushStatus(ctx context.Context) error {
	a.pubMu.Lock()
	defer a.pubMu.Unlock()
	a.mu.Lock()
	st, seq := a.status, a.statusSeq
	a.mu.Unlock()
	if seq == a.publishedSeq {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	defer cancel()
	b, err := json.Marshal(st)
	if err == nil {
		a.statusBytes.Store(int64(len(b)))
		err = a.store.Put(ctx, intent.StatusPrefix+a.cfg.Node, b)
	} else {
		err = fmt.Errorf("encode status: %w", err)
	}
	a.publishedAt = time.Now()
	a.mu.Lock()
	if err != nil {
		a.statusWriteFailures++
	} else {
		a.statusWrites++
	}
	a.mu.Unlock()
	if err != nil {
		return err
	}
	a.publishedSeq = seq
	return nil
}

// publishNow has the publisher write the latest status without waiting
// for its interval (after a full list).
func (a *Agent) publishNow() {
	a.statusNow.Store(true)
	select {
	case a.statusKick <- struct{}{}:
	default:
	}
}

// publishStatuses writes the status whenever it changed, at most once per
// statusEvery, until ctx ends. A failed write is retried after the same
// interval; the datapath never waits for it.
func (a *Agent) publishStatuses(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.statusKick:
		}
		every := statusEvery(a.cfg.StatusEvery, int(a.knownHosts.Load()), int(a.statusBytes.Load()))
		a.pubMu.Lock()
		wait := every - time.Since(a.publishedAt)
		a.pubMu.Unlock()
		// Taken whether or not the pace would wait: a request left
		// standing would let a later change skip its interval.
		now := a.statusNow.Swap(false)
		if wait > 0 && !now {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if err := a.flushStatus(ctx); err != nil && ctx.Err() == nil {
			a.statusLog.Warn("status", "cannot write the agent's status; will retry", "err", err, "retry_in", every)
			select {
			case a.statusKick <- struct{}{}:
			default:
			}
		}
	}
}

// StatusWrites returns how many status writes the store took, and how
// many it refused or did not answer.
func (a *Agent) StatusWrites() (writes, failures uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.statusWrites, a.statusWriteFailures
}
