package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// What every daemon (controller, agent, gateway run, xtr run, vnat run)
// takes the same way: how it logs (--log-format, --log-level) and its
// operations port (--metrics-addr: /metrics, /healthz, /readyz, /version;
// internal/opsport). A wrong value is refused while the flags are parsed,
// naming the flag and the choices.

// logFormat is --log-format: text (slog's key=value) or json (one object
// a line, for a log shipper).
type logFormat string

// String implements pflag.Value.
func (f *logFormat) String() string { return string(*f) }

// Set implements pflag.Value.
func (f *logFormat) Set(v string) error {
	switch v {
	case "text", "json":
		*f = logFormat(v)
		return nil
	}
	return fmt.Errorf("want text or json")
}

// Type implements pflag.Value.
func (f *logFormat) Type() string { return "text|json" }

// logLevel is --log-level: the least severe level written.
type logLevel slog.Level

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// String implements pflag.Value.
func (l *logLevel) String() string { return strings.ToLower(slog.Level(*l).String()) }

// Set implements pflag.Value.
func (l *logLevel) Set(v string) error {
	lv, ok := logLevels[v]
	if !ok {
		return fmt.Errorf("want debug, info, warn or error")
	}
	*l = logLevel(lv)
	return nil
}

// Type implements pflag.Value.
func (l *logLevel) Type() string { return "debug|info|warn|error" }

// logFlags are one daemon's --log-format and --log-level.
type logFlags struct {
	format logFormat
	level  logLevel
}

// addLogFlags adds --log-format and --log-level to a daemon's command.
func addLogFlags(c *cobra.Command) *logFlags {
	l := &logFlags{format: "text", level: logLevel(slog.LevelInfo)}
	c.Flags().Var(&l.format, "log-format", "log lines as text (key=value) or json (one object a line)")
	c.Flags().Var(&l.level, "log-level", "the least severe log level written")
	return l
}

// logger is the daemon's logger, on stderr.
func (l *logFlags) logger() *slog.Logger { return l.to(os.Stderr) }

func (l *logFlags) to(w io.Writer) *slog.Logger {
	o := &slog.HandlerOptions{Level: slog.Level(l.level)}
	if l.format == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// addMetricsAddrFlag adds a daemon's --metrics-addr, its operations port.
func addMetricsAddrFlag(c *cobra.Command, addr *string, def, where string) {
	c.Flags().StringVar(addr, "metrics-addr", def,
		"IP:PORT serving /metrics, /healthz, /readyz and /version ("+where+"); empty: none")
}
