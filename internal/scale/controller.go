package scale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/controller"
)

// controllerRun is the controller under test: the real daemon
// (controller.RunDaemon), in this process or as `onehop controller` of a
// binary, which lets its memory be read on its own.
type controllerRun struct {
	cfg    controller.DaemonConfig
	binary string
	logTo  string

	cancel context.CancelFunc
	done   chan error
	cmd    *exec.Cmd
}

func (c *controllerRun) start() error {
	c.done = make(chan error, 1)
	if c.binary == "" {
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel = cancel
		logf, err := os.OpenFile(c.logTo, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		log := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		go func() {
			c.done <- controller.RunDaemon(ctx, c.cfg, log)
			logf.Close()
		}()
		return nil
	}
	args := []string{"controller", "--insecure", "--api-listen", c.cfg.APIListen}
	if len(c.cfg.EtcdEndpoints) > 0 {
		args = append(args, "--etcd-endpoints", strings.Join(c.cfg.EtcdEndpoints, ","))
	} else {
		args = append(args, "--data-dir", c.cfg.DataDir, "--client-url", c.cfg.ClientURL, "--peer-url", c.cfg.PeerURL)
	}
	logf, err := os.OpenFile(c.logTo, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	c.cmd = exec.Command(c.binary, args...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s controller: %w", c.binary, err)
	}
	go func() { c.done <- c.cmd.Wait(); logf.Close() }()
	return nil
}

// stop ends the controller the way an operator's restart does (SIGTERM,
// or its context ending) and waits for it.
func (c *controllerRun) stop() error {
	if c.cmd != nil {
		c.cmd.Process.Signal(syscall.SIGTERM)
	} else {
		c.cancel()
	}
	select {
	case err := <-c.done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return fmt.Errorf("controller: %w", err)
		}
		return nil
	case <-time.After(30 * time.Second):
		if c.cmd != nil {
			c.cmd.Process.Kill()
		}
		return errors.New("controller did not stop within 30s")
	}
}

// exited reports the controller's end if it ended on its own.
func (c *controllerRun) exited() error {
	select {
	case err := <-c.done:
		c.done <- err
		if err == nil {
			err = errors.New("exited")
		}
		return fmt.Errorf("controller stopped (log: %s): %w", c.logTo, err)
	default:
		return nil
	}
}

// memory is the controller's resident memory now and at its peak, in
// bytes; 0 when it runs in this process (not separable).
func (c *controllerRun) memory() (rss, peak int64) {
	if c.cmd == nil {
		return 0, 0
	}
	return procMemory(c.cmd.Process.Pid)
}

// cpu is the CPU time the controller's process has used (0 when it runs
// in this process: the harness's own figure holds it).
func (c *controllerRun) cpu() time.Duration {
	if c.cmd == nil {
		return 0
	}
	return procCPU(c.cmd.Process.Pid)
}

// procCPU reads the user and system time pid has used, from its stat
// (fields 14 and 15, in clock ticks of 1/100 s: Linux's USER_HZ).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// selfCPU is the user and system time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procMemory reads VmRSS and VmHWM of pid.
func procMemory(pid int) (rss, peak int64) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak
}
