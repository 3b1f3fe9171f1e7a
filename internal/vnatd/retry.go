package vnatd

import (
	"time"

	"github.com/onehop/onehop/internal/backoff"
)

// The daemon's retry loops all run on a backoff.Backoff, and their
// schedules are here, so how often and for how long the daemon tries again
// reads in one place. The walk's and the claim's can be changed in Config
// (WalkRetry, ClaimRetry: a field left zero is the default's).

// SuspTries is how many times a claim (VNAT_SUSP_PRIMARY + VCMP_KEY) is
// sent to a peer that does not answer, with a doubling pause between
// tries, before its connections are primary by default (§3.3.1.2: no
// negotiation, both ends primary).
const SuspTries = 4

// MaxKeyTries is how many times AgreeKeys asks a peer's daemon that does
// not know a connection yet (it looks for new connections on its own clock).
const MaxKeyTries = 5

// StoredTries is how many walks in all a connection makes whose walk
// stored its location but could not reach every place (locate), on
// WalkRetry's pauses, before it waits for its peer.
const StoredTries = 4

// RetryUnreachable is how long an unreachable location server is left alone.
const RetryUnreachable = 5 * time.Second

var (
	// walkRetry: a locate walk that reached nobody starts again after
	// 100 ms, doubling to 2 s, for 15 s before the migration is aborted:
	// the new address often comes before the route to the peer's place
	// (DHCP, the new subnet's gateway).
	walkRetry = backoff.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, For: 15 * time.Second}
	// claimRetry: a suspend claim is sent again after 250 ms, doubling,
	// SuspTries times in all.
	claimRetry = backoff.Backoff{Initial: 250 * time.Millisecond, Tries: SuspTries}
	// keyRetry: first-contact keys are asked for MaxKeyTries times, with
	// no pause of their own: AgreeKeys asks once a contact round
	// (ContactEvery), so the contact loop sets the pace.
	keyRetry = backoff.Backoff{Tries: MaxKeyTries}
	// serverRetry: an unreachable location server is left alone for
	// RetryUnreachable each time, not asked on every step.
	serverRetry = backoff.Backoff{Initial: RetryUnreachable, Max: RetryUnreachable}
)
