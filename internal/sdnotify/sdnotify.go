// Package sdnotify tells systemd how a Type=notify service is doing
// (sd_notify(3)): a datagram of NEWLINE-separated assignments to the unix
// socket named by $NOTIFY_SOCKET. Without that variable (not started by
// systemd, or not as Type=notify) every call does nothing, so the daemons
// call it unconditionally.
package sdnotify

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
)

// The states the daemons send.
const (
	// Ready says start-up is done: systemd starts the units ordered after
	// this one and `systemctl start` returns.
	Ready = "READY=1"
	// Stopping says shutdown has begun.
	Stopping = "STOPPING=1"
)

// Status is a one-line status `systemctl status` shows.
func Status(s string) string {
	// A newline would start another assignment.
	return "STATUS=" + strings.ReplaceAll(s, "\n", " ")
}

// Notify sends states, one per line, to $NOTIFY_SOCKET in one datagram.
// It returns nil without sending when the variable is unset.
func Notify(states ...string) error {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil
	}
	// '@' names a socket in the abstract namespace, which Go spells with
	// a leading NUL byte.
	if strings.HasPrefix(name, "@") {
		name = "\x00" + name[1:]
	} else if !strings.HasPrefix(name, "/") {
		return fmt.Errorf("sd_notify: NOTIFY_SOCKET=%q is neither a path nor an abstract name", name)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Join(states, "\n") + "\n")); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}

// Tell is Notify for a daemon: systemd not hearing is no reason to stop,
// so a failure is logged, not returned.
func Tell(log *slog.Logger, states ...string) {
	if err := Notify(states...); err != nil {
		log.Warn("cannot tell systemd", "states", states, "err", err)
	}
}
