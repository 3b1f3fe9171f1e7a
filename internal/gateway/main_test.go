package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// daemonEnv, when set, makes the test binary the gateway daemon itself
// (gateway.Run with the JSON Config the variable holds) instead of running
// tests: a privileged test starts it inside a namespace to run the gateway
// with settings `onehop gateway run` has no flag for (yet).
const daemonEnv = "ONEHOP_GATEWAY_TEST_DAEMON"

func TestMain(m *testing.M) {
	if js := os.Getenv(daemonEnv); js != "" {
		os.Exit(daemonMain(js))
	}
	os.Exit(m.Run())
}

func daemonMain(js string) int {
	var cfg Config
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", daemonEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, &cfg, StaticResolver(cfg.Static), slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
