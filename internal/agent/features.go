package agent

import (
	"crypto/tls"
	"log/slog"
	"net/netip"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/egress"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/portspace"
	"github.com/onehop/onehop/internal/tap"
	"github.com/onehop/onehop/internal/vnatrelay"
)

// Env is what a feature's constructor may need from the agent.
type Env struct {
	// Router is the virtual router, the first feature.
	Router *Router
	// Kernel is the loaded datapath, for a feature's sync to reach its maps
	// (Kernel.Map). Nil in tests that run the agent on a fake datapath.
	Kernel *datapath.Kernel
	// Log is the agent's log.
	Log *slog.Logger
	// Node is the host's name (a metric's node label).
	Node string
	// SliverCgroups is Config.SliverCgroups: where slivers' processes live.
	SliverCgroups string
	// LocationServer is Config.LocationServer: where VMs' VNAT location
	// streams are relayed.
	LocationServer netip.Addr
	// LocationTLS is Config.LocationTLS: the channel the relay speaks on.
	LocationTLS *tls.Config
	// Listeners counts the features' listeners (the agent's /metrics).
	Listeners *accept.Stats
}

// registry lists every datapath feature the agent runs, in the order they
// sync. A new feature adds its one line here (docs/architecture.md); the
// agent runs a sub-controller for each.
func registry(env Env) []feature.Feature {
	return []feature.Feature{
		env.Router,
		portspace.New(env.Kernel).WithAgent(env.Node, env.Log).WithCgroups(env.SliverCgroups),
		tap.New(env.Kernel).WithAgent(env.Node, env.Log),
		egress.New(env.Kernel).WithAgent(env.Node, env.Log),
		vnatrelay.New(env.LocationServer, env.Log).WithTLS(env.LocationTLS).WithListeners(env.Listeners),
	}
}
