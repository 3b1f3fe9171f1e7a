package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/ratelog"
)

// keepClosed is how many finished connections status still shows.
const keepClosed = 64

// initialAttempt bounds the initial subflow's connect on a path when
// other paths are left to try.
const initialAttempt = 2500 * time.Millisecond

// joinAnswer is how long a join's SYN may go unanswered before status says
// so: the SYN and two retransmissions (RTO 1 s, then 2 s).
const joinAnswer = 3 * time.Second

// subflowRetry paces the path manager's SUBFLOW_CREATE while the kernel
// refuses it (ENOTCONN) because the connection is not fully established
// yet: for a client that has sent nothing, until the server's first data.
var subflowRetry = backoff.Backoff{Initial: 5 * time.Millisecond, Max: 500 * time.Millisecond, For: 60 * time.Second}

// Dialer opens the gateway's side of a connection: MPTCP from a path's EID
// (from the zero Addr: plain TCP by the ordinary routes).
type Dialer func(ctx context.Context, from netip.Addr, to netip.AddrPort, mptcp bool) (*net.TCPConn, error)

// SubflowReader lists an MPTCP socket's subflows (ReadSubflows in the
// running daemon).
type SubflowReader func(*net.TCPConn) ([]SubflowInfo, error)

// Engine is the gateway's state: its paths, the connections it carries and
// what it counted. The proxy, the link watcher and the control socket all
// go through it.
type Engine struct {
	cfg      *Config
	res      Resolver
	find     PathFinder
	pin      Pinner
	pm       PathManager
	dial     Dialer
	subflows SubflowReader
	tcpInfo  func(*net.TCPConn) (SubflowInfo, error)
	log      *slog.Logger
	rl       *ratelog.Logger

	mu       sync.Mutex
	pathUp   []bool
	conns    map[uint64]*conn
	closed   []ConnStatus
	nextID   uint64
	counters map[string]uint64
	// perClient counts each user address's connections (--max-per-client).
	perClient map[netip.Addr]int
	// listeners counts the intercept listener (run.go's serve): its
	// refusals over --max-conns and accept errors waited out.
	listeners *accept.Stats
	// probeDown holds the locators RLOC probing found down, per path.
	probeDown map[ProbeKey]bool
	prober    *Prober
	// infraDropped reads the packets dropped for infrastructure addresses.
	infraDropped func() (uint64, error)
}

// conn is one intercepted connection.
type conn struct {
	id     uint64
	client netip.AddrPort
	dest   netip.AddrPort
	mode   Mode
	why    string
	rec    Record
	up     *net.TCPConn
	token  uint32
	opened time.Time
	// seen is every subflow the connection had, with the last figures
	// read (the kernel forgets a subflow once it is closed); guarded by
	// Engine.mu.
	seen []SubflowStatus
	// joins is where each path's subflow stands (the initial one's too),
	// by path index; guarded by Engine.mu.
	joins map[int]*join
	// ignoreClosed holds the local ports of subflows the gateway closed
	// itself: their close events say nothing about the server.
	ignoreClosed map[uint16]bool
	// kept is a dead path's subflow kept because it was the connection's
	// last: it is closed once a subflow on a live path has joined, and
	// resumes if its path comes back first.
	kept *keptSubflow
	// plan is the subflows planned when it opened: a path whose route
	// went with its link is still one the connection should have.
	plan []Subflow
	// paths is the last reading of planned and established paths, what
	// status shows once the connection is finished.
	paths    pathCount
	toServer atomic.Uint64
	toClient atomic.Uint64
	finished atomic.Bool
}

// joinState is where one path's subflow of a connection stands.
type joinState int

const (
	// joinWaiting: the kernel refuses the subflow (ENOTCONN) until the
	// connection is fully established; the gateway retries.
	joinWaiting joinState = iota
	// joinSent: SUBFLOW_CREATE succeeded, the MP_JOIN SYN is out.
	joinSent
	// joinUp: the subflow joined (or is the initial one).
	joinUp
	// joinFailed: there is no subflow; why says what the kernel said.
	joinFailed
)

// join is one path's subflow of a connection, as the gateway asked for it
// and the kernel's events told.
type join struct {
	state joinState
	why   string
	since time.Time
}

// keptSubflow is a connection's last subflow, on a path that died, kept
// while a subflow on a live path is being joined.
type keptSubflow struct {
	path         int
	sfs          []SubflowInfo
	why, counter string
}

// pathCount is a connection's planned and established paths and why the
// missing ones are missing.
type pathCount struct {
	planned, established int
	missing              []MissingPath
}

// setJoin records path's join state (c's fields are guarded by e.mu).
func (c *conn) setJoin(path int, st joinState, why string) {
	if c.joins == nil {
		c.joins = map[int]*join{}
	}
	c.joins[path] = &join{state: st, why: why, since: time.Now()}
}

// EngineDeps are the engine's seams: the kernel-touching parts in the
// daemon, fakes in tests.
type EngineDeps struct {
	Resolver Resolver
	Find     PathFinder
	Pin      Pinner
	PM       PathManager
	Dial     Dialer
	Subflows SubflowReader
	// TCPInfo reads a connection that fell back to plain TCP (optional).
	TCPInfo func(*net.TCPConn) (SubflowInfo, error)
	Logger  *slog.Logger
	// Prober, when RLOC probing is on, is read for status and counters
	// (its changes come in through SetRLOCUp).
	Prober *Prober
	// InfraDropped reads how many of the users' packets were dropped for
	// an infrastructure address (the nftables counter; optional).
	InfraDropped func() (uint64, error)
}

// NewEngine returns an engine with every path up.
func NewEngine(cfg *Config, d EngineDeps) *Engine {
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	up := make([]bool, len(cfg.Paths))
	for i := range up {
		up[i] = true
	}
	return &Engine{
		cfg: cfg, res: d.Resolver, find: d.Find, pin: d.Pin, pm: d.PM, dial: d.Dial, subflows: d.Subflows, tcpInfo: d.TCPInfo,
		log: log, rl: ratelog.New(log, 5, 10*time.Second, time.Now),
		pathUp: up, conns: map[uint64]*conn{}, counters: map[string]uint64{}, perClient: map[netip.Addr]int{}, listeners: accept.NewStats(nil),
		probeDown: map[ProbeKey]bool{}, prober: d.Prober, infraDropped: d.InfraDropped,
	}
}

// admit takes one of client's connection slots: false (and counted) when
// it holds MaxPerClient already; release gives it back.
func (e *Engine) admit(client netip.Addr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.MaxPerClient > 0 && e.perClient[client] >= e.cfg.MaxPerClient {
		e.counters["refused_per_client"]++
		return false
	}
	e.perClient[client]++
	return true
}

func (e *Engine) release(client netip.Addr) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.perClient[client]--; e.perClient[client] <= 0 {
		delete(e.perClient, client)
	}
}

func (e *Engine) count(k string) {
	e.mu.Lock()
	e.counters[k]++
	e.mu.Unlock()
}

func (e *Engine) isUp(i int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return i >= 0 && i < len(e.pathUp) && e.pathUp[i]
}

// findUsable is the PathFinder with the locators RLOC probing found down
// over their path left out.
func (e *Engine) findUsable(rloc netip.Addr) (int, bool) {
	path, ok := e.find(rloc)
	if !ok {
		return 0, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return path, !e.probeDown[ProbeKey{Path: path, RLOC: rloc}]
}

// Open decides and opens the gateway's side of a connection intercepted
// from client to dest: resolve, plan, pin, dial, add subflows. It returns
// the registered connection; Splice carries it and Finish forgets it.
func (e *Engine) Open(ctx context.Context, client, dest netip.AddrPort) (*conn, error) {
	c := &conn{client: client, dest: dest, opened: time.Now()}
	rec, err := e.res.Resolve(ctx, dest.Addr())
	var plan Plan
	switch {
	case errors.Is(err, ErrNoMapping):
		plan = Plan{Mode: ModeNative, Why: "no mapping"}
	case err != nil:
		e.rl.Warn("resolve", "gateway: map-resolver failed; forwarding natively", "dest", dest.Addr(), "err", err)
		plan = Plan{Mode: ModeNative, Why: "resolve: " + err.Error()}
	default:
		c.rec = rec
		plan = PlanFor(rec, e.isUp, e.findUsable)
	}
	c.mode, c.why = plan.Mode, plan.Why
	if plan.Mode == ModeMPTCP {
		c.plan = append([]Subflow(nil), plan.Subflows...)
		var ok []Subflow
		for _, sf := range plan.Subflows {
			if err := e.pin.Pin(sf.Path, rec, sf.Locator.Addr); err != nil {
				e.rl.Warn("pin", "gateway: pinning a subflow's path failed; leaving it out", "path", e.cfg.Paths[sf.Path].Name, "err", err)
				e.count("pin_errors")
				e.mu.Lock()
				c.setJoin(sf.Path, joinFailed, "pinning the path failed: "+err.Error())
				e.mu.Unlock()
				continue
			}
			ok = append(ok, sf)
		}
		plan.Subflows = ok
		if len(ok) == 0 {
			c.mode, c.why = ModeNative, "no path could be pinned"
		}
	}
	if c.mode == ModeNative {
		up, err := e.dial(ctx, netip.Addr{}, dest, false)
		if err != nil {
			e.count("dial_errors")
			return nil, fmt.Errorf("dial %s natively: %w", dest, err)
		}
		c.up = up
		e.register(c)
		e.count("native")
		return c, nil
	}
	/* the initial subflow on the best path; if it cannot connect (a path
	   that failed further on than our link), the next path's */
	var up *net.TCPConn
	var errs []error
	for i, first := range plan.Subflows {
		p := e.cfg.Paths[first.Path]
		actx, cancel := ctx, context.CancelFunc(func() {})
		if i < len(plan.Subflows)-1 {
			/* a SYN and one retransmission (1 s RTO): a path that died
			   beyond our link does not hold the user up for long */
			actx, cancel = context.WithTimeout(ctx, initialAttempt)
		}
		up, err = e.dial(actx, p.EID, dest, true)
		cancel()
		if err == nil {
			plan.Subflows = append([]Subflow{first}, append(plan.Subflows[:i:i], plan.Subflows[i+1:]...)...)
			break
		}
		e.count("dial_errors")
		errs = append(errs, fmt.Errorf("from %s (path %s): %w", p.EID, p.Name, err))
		if ctx.Err() != nil {
			break
		}
	}
	if up == nil {
		return nil, fmt.Errorf("dial %s: %w", dest, errors.Join(errs...))
	}
	c.up = up
	st, err := ReadMPTCPInfo(up)
	if err != nil || st.Fallback || !mptcpInUse(up) {
		/* the server did not answer MP_CAPABLE: plain TCP over the best RLOC's path */
		c.mode, c.why = ModeTCPFallback, "server does not speak MPTCP"
		e.register(c)
		e.count("tcp_fallback")
		return c, nil
	}
	c.token = st.Token
	c.setJoin(plan.Subflows[0].Path, joinUp, "")
	e.register(c)
	e.count("mptcp")
	for _, sf := range plan.Subflows[1:] {
		go e.addSubflow(c, sf.Path)
	}
	return c, nil
}

// mptcpInUse is TCPConn.MultipathTCP without its error.
func mptcpInUse(c *net.TCPConn) bool {
	ok, err := c.MultipathTCP()
	return err == nil && ok
}

// addSubflow asks the path manager for c's subflow on path. The kernel
// refuses (ENOTCONN) until the connection is fully established, which for
// a client that has sent nothing yet is when the server's first data
// arrives, so it retries with backoff while the connection lives. The
// call succeeding means only that the MP_JOIN SYN is out: what became of
// it comes with the kernel's subflow events (SubflowEvent).
func (e *Engine) addSubflow(c *conn, path int) {
	p := e.cfg.Paths[path]
	r := subflowRetry.Start(time.Now())
	for {
		/* noted before the call: the answer's event can come before
		   Create returns */
		e.mu.Lock()
		c.setJoin(path, joinSent, "")
		e.mu.Unlock()
		err := e.pm.Create(c.token, uint8(path+1), p.EID, c.dest)
		if err == nil {
			e.count("subflows_created")
			return
		}
		if errors.Is(err, syscall.ENOTCONN) && !c.finished.Load() {
			if d, ok := r.Next(time.Now()); ok {
				e.mu.Lock()
				c.setJoin(path, joinWaiting, "")
				e.mu.Unlock()
				time.Sleep(d)
				continue
			}
		}
		e.mu.Lock()
		c.setJoin(path, joinFailed, "path manager: "+err.Error())
		e.mu.Unlock()
		e.rl.Warn("subflow", "gateway: adding a subflow failed", "conn", c.id, "path", p.Name, "err", err)
		e.count("subflow_errors")
		return
	}
}

// SubflowEvent takes the kernel's word on one subflow (WatchSubflowEvents):
// a join answered or refused, a subflow the server closed. A subflow on a
// live path joining lets a connection's kept last subflow on a dead path go.
func (e *Engine) SubflowEvent(ev SubflowEvent) {
	path := e.cfg.PathByEID(ev.Local.Addr())
	if path < 0 {
		return
	}
	e.mu.Lock()
	var c *conn
	for _, x := range e.conns {
		if x.mode == ModeMPTCP && x.token == ev.Token {
			c = x
			break
		}
	}
	if c == nil {
		e.mu.Unlock()
		return
	}
	if ev.Established {
		c.setJoin(path, joinUp, "")
		e.counters["subflows_joined"]++
		kept := c.kept
		if kept != nil && kept.path != path {
			c.kept = nil
		} else {
			kept = nil
		}
		e.mu.Unlock()
		if kept != nil {
			for _, sf := range kept.sfs {
				e.destroy(c, sf, kept.why, kept.counter)
			}
		}
		return
	}
	if c.ignoreClosed[ev.Local.Port()] {
		delete(c.ignoreClosed, ev.Local.Port())
		e.mu.Unlock()
		return
	}
	j := c.joins[path]
	if j == nil || j.state == joinFailed {
		e.mu.Unlock()
		return
	}
	why := closedWhy(ev, j, c.dest, time.Now())
	c.setJoin(path, joinFailed, why)
	e.counters["subflows_failed"]++
	e.mu.Unlock()
	e.rl.Warn("join:"+c.dest.String(), "gateway: a subflow failed", "conn", c.id, "path", e.cfg.Paths[path].Name, "dest", c.dest, "why", why)
}

// resetReasons name MP_TCPRST's reason codes (RFC 8684 §3.6).
var resetReasons = []string{"unspecified", "MPTCP-specific error", "lack of resources", "administratively prohibited", "too much outstanding data", "unacceptable performance", "middlebox interference"}

// closedWhy says what a subflow's close event means for the join that
// was in state j.
func closedWhy(ev SubflowEvent, j *join, dest netip.AddrPort, now time.Time) string {
	verb := "refused by the server"
	if j.state == joinUp {
		verb = "closed by the server"
	}
	switch {
	case ev.Reset:
		r := fmt.Sprintf("reason %d", ev.ResetReason)
		if int(ev.ResetReason) < len(resetReasons) {
			r = resetReasons[ev.ResetReason]
		}
		return fmt.Sprintf("%s: MP_TCPRST, %s", verb, r)
	case ev.Err == syscall.ECONNREFUSED:
		return fmt.Sprintf("refused: the server answered the MP_JOIN SYN with a plain reset, nothing listens on %s any more "+
			"(a server that closes its listening socket once it has accepted, such as socat without fork, cannot take another path)", dest)
	case ev.Err == syscall.ETIMEDOUT && j.state != joinUp:
		return "join sent, no answer (the kernel gave up)"
	case ev.Err != 0:
		return fmt.Sprintf("%s: %v", verb, ev.Err)
	case j.state == joinUp && now.Sub(j.since) < time.Second:
		return "closed by the server as soon as it joined (a server whose MPTCP limits take no more subflows does this: ip mptcp limits set subflows N)"
	case j.state == joinUp:
		return "closed by the server"
	}
	return "closed before it was established"
}

func (e *Engine) register(c *conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nextID++
	c.id = e.nextID
	e.conns[c.id] = c
}

// Splice copies both ways between the user's connection and the gateway's
// until both directions end, each direction by (*net.TCPConn).ReadFrom,
// which the Go runtime turns into splice(2) through a pipe (no copy
// through user space) when the kernel allows it on both sockets.
func (e *Engine) Splice(c *conn, client *net.TCPConn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, err := c.up.ReadFrom(client)
		c.toServer.Store(uint64(n))
		if err != nil && !isClosed(err) {
			e.rl.Info("copy", "gateway: user to server ended with an error", "conn", c.id, "err", err)
		}
		c.up.CloseWrite() //nolint:errcheck // the server went away: nothing left to tell it
	}()
	n, err := client.ReadFrom(c.up)
	c.toClient.Store(uint64(n))
	e.statusOf(c) /* the subflows' figures before the kernel closes them */
	if err != nil && !isClosed(err) {
		e.rl.Info("copy", "gateway: server to user ended with an error", "conn", c.id, "err", err)
	}
	client.CloseWrite() //nolint:errcheck // the user went away
	wg.Wait()
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Finish records c's last figures and forgets it; it closes its socket.
func (e *Engine) Finish(c *conn) {
	c.finished.Store(true)
	st := e.statusOf(c)
	st.Open = false
	now := time.Now()
	st.Closed = &now
	c.up.Close() //nolint:errcheck // done with it either way
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.conns, c.id)
	e.closed = append(e.closed, st)
	if len(e.closed) > keepClosed {
		e.closed = e.closed[len(e.closed)-keepClosed:]
	}
}

// SetPathUp records a path's link going down or up. Down: every
// connection's subflow on it is closed now (MPTCP carries on over the
// others) rather than left to stall through retransmission timeouts.
// Up: the path's routes are pinned again (the kernel dropped them with the
// link) and every MPTCP connection whose record has a usable locator on it
// gets its subflow back.
func (e *Engine) SetPathUp(path int, up bool) {
	e.mu.Lock()
	was := e.pathUp[path]
	e.pathUp[path] = up
	e.mu.Unlock()
	if was == up {
		return
	}
	conns := e.mptcpConns()
	p := e.cfg.Paths[path]
	e.log.Info("gateway: path "+map[bool]string{true: "up", false: "down"}[up], "path", p.Name, "dev", p.Dev, "connections", len(conns))
	if !up {
		e.count("path_down")
		e.closeSubflows(path, conns, "path down", "subflows_closed_path_down", func(*conn) bool { return true })
		return
	}
	e.count("path_up")
	e.unkeep(path, conns)
	if err := e.pin.Repin(path); err != nil {
		e.log.Warn("gateway: re-pinning a path that came back", "path", p.Name, "err", err)
	}
	e.restoreSubflows(path, conns, netip.Addr{})
}

// SetRLOCUp records RLOC probing finding locator rloc down (or up again)
// over path: the same as the path's link going down or up, for the
// connections whose subflow on path goes to rloc.
func (e *Engine) SetRLOCUp(path int, rloc netip.Addr, up bool) {
	k := ProbeKey{Path: path, RLOC: rloc}
	e.mu.Lock()
	was := !e.probeDown[k]
	if up {
		delete(e.probeDown, k)
	} else {
		e.probeDown[k] = true
	}
	e.mu.Unlock()
	if was == up {
		return
	}
	conns := e.mptcpConns()
	p := e.cfg.Paths[path]
	/* rate-limited: a far end can make its locator flap */
	e.rl.Info("rloc:"+p.Name+":"+rloc.String(), "gateway: rloc "+map[bool]string{true: "up", false: "down"}[up]+" (rloc probe)", "path", p.Name, "rloc", rloc, "connections", len(conns))
	if !up {
		e.count("rloc_down")
		e.closeSubflows(path, conns, "rloc probe", "subflows_closed_rloc_down", func(c *conn) bool {
			/* the locator this connection's subflow on path goes to */
			for _, sf := range PlanFor(c.rec, nil, e.find).Subflows {
				if sf.Path == path {
					return sf.Locator.Addr == rloc
				}
			}
			return false
		})
		return
	}
	e.count("rloc_up")
	if e.isUp(path) {
		e.unkeep(path, conns)
		e.restoreSubflows(path, conns, rloc)
	}
}

// mptcpConns lists the MPTCP connections.
func (e *Engine) mptcpConns() []*conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	conns := make([]*conn, 0, len(e.conns))
	for _, c := range e.conns {
		if c.mode == ModeMPTCP {
			conns = append(conns, c)
		}
	}
	return conns
}

// closeSubflows closes the subflow on path of each connection match
// picks, noting why in its status and counting it under counter. A
// connection's last live subflow is kept instead (a connection with no
// subflow cannot resume when the path does, if the server takes no join)
// while a subflow on each live path of its plan is joined at once; the
// first to join lets it go (SubflowEvent).
func (e *Engine) closeSubflows(path int, conns []*conn, why, counter string, match func(*conn) bool) {
	p := e.cfg.Paths[path]
	for _, c := range conns {
		if !match(c) {
			continue
		}
		sfs, err := e.subflows(c.up)
		if err != nil {
			continue
		}
		var dead []SubflowInfo
		others := false
		for _, sf := range sfs {
			if sf.Local.Addr() == p.EID {
				dead = append(dead, sf)
			} else if i := e.cfg.PathByEID(sf.Local.Addr()); sf.State == 1 && i >= 0 && e.isUp(i) {
				others = true
			}
		}
		if len(dead) == 0 {
			continue
		}
		if !others {
			e.mu.Lock()
			c.kept = &keptSubflow{path: path, sfs: dead, why: why, counter: counter}
			e.counters["last_subflow_kept"]++
			e.mu.Unlock()
			e.rl.Info("kept:"+c.dest.String(), "gateway: a connection's last subflow is on a dead path; kept while another path joins", "conn", c.id, "path", p.Name, "why", why)
			e.rejoin(c, path, sfs)
			continue
		}
		for _, sf := range dead {
			e.destroy(c, sf, why, counter)
		}
	}
}

// destroy closes one subflow of c, noting why in its status.
func (e *Engine) destroy(c *conn, sf SubflowInfo, why, counter string) {
	e.mu.Lock()
	if c.ignoreClosed == nil {
		c.ignoreClosed = map[uint16]bool{}
	}
	c.ignoreClosed[sf.Local.Port()] = true
	e.mu.Unlock()
	if err := e.pm.Destroy(c.token, sf.Local, sf.Remote); err != nil {
		e.rl.Warn("subflow", "gateway: closing a subflow of a failed path", "conn", c.id, "local", sf.Local, "why", why, "err", err)
		return
	}
	e.count(counter)
	s := e.subflowStatus(sf)
	s.State = "closed: " + why
	e.mu.Lock()
	c.note(s, true)
	e.mu.Unlock()
}

// rejoin asks, now, for c's subflow on every live path of its plan but
// dying that has none joined; a join still waiting for an answer is
// replaced (the kernel's next SYN retransmission may be a minute away).
func (e *Engine) rejoin(c *conn, dying int, sfs []SubflowInfo) {
	for _, sf := range PlanFor(c.rec, e.isUp, e.findUsable).Subflows {
		if sf.Path == dying {
			continue
		}
		eid := e.cfg.Paths[sf.Path].EID
		live := false
		for _, s := range sfs {
			if s.Local.Addr() != eid {
				continue
			}
			if s.State == 1 {
				live = true
			} else if s.State == 2 { /* SYN_SENT: unanswered so far */
				e.destroy(c, s, "replaced by a new join", "subflows_rejoined")
			}
		}
		if live {
			continue
		}
		if err := e.pin.Pin(sf.Path, c.rec, sf.Locator.Addr); err != nil {
			e.rl.Warn("pin", "gateway: pinning a path to move a connection onto", "path", e.cfg.Paths[sf.Path].Name, "err", err)
			continue
		}
		go e.addSubflow(c, sf.Path)
	}
}

// unkeep forgets the kept last subflows on path, which came back: they
// carry the connection again.
func (e *Engine) unkeep(path int, conns []*conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range conns {
		if c.kept != nil && c.kept.path == path {
			c.kept = nil
		}
	}
}

// restoreSubflows gives each connection whose plan (now) has a subflow on
// path (to rloc, when valid) that subflow back if it has none alive.
func (e *Engine) restoreSubflows(path int, conns []*conn, rloc netip.Addr) {
	p := e.cfg.Paths[path]
	for _, c := range conns {
		plan := PlanFor(c.rec, e.isUp, e.findUsable)
		for _, sf := range plan.Subflows {
			if sf.Path != path || rloc.IsValid() && sf.Locator.Addr != rloc {
				continue
			}
			if sfs, err := e.subflows(c.up); err == nil && hasLocal(sfs, p.EID) {
				continue
			}
			if err := e.pin.Pin(path, c.rec, sf.Locator.Addr); err != nil {
				e.rl.Warn("pin", "gateway: pinning a path that came back", "path", p.Name, "err", err)
				continue
			}
			/* in the background: a connection not yet fully established
			   waits (addSubflow retries) without holding up the link watcher */
			go e.addSubflow(c, path)
		}
	}
}

// ProbeTargets lists the locators the open connections use, each with the
// path that reaches it and the record's EID prefix: what RLOC probing
// watches. Every usable locator of a connection's record is listed, the
// ones found down too (probing is what brings them back).
func (e *Engine) ProbeTargets() []Probe {
	e.mu.Lock()
	recs := make([]Record, 0, len(e.conns))
	for _, c := range e.conns {
		if c.mode == ModeMPTCP || c.mode == ModeTCPFallback {
			recs = append(recs, c.rec)
		}
	}
	e.mu.Unlock()
	seen := map[ProbeKey]bool{}
	var out []Probe
	for _, r := range recs {
		for _, l := range r.Locators {
			if l.Priority == Unusable {
				continue
			}
			path, ok := e.find(l.Addr)
			k := ProbeKey{Path: path, RLOC: l.Addr}
			if !ok || seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, Probe{Key: k, EID: r.EID})
		}
	}
	return out
}

// hasLocal says whether a subflow from a is alive (established or
// connecting); a destroyed subflow lingers in the list in TCP_CLOSE.
func hasLocal(sfs []SubflowInfo, a netip.Addr) bool {
	for _, s := range sfs {
		if s.Local.Addr() == a && s.State >= 1 && s.State <= 3 {
			return true
		}
	}
	return false
}

// PathStatus is one path as status shows it.
type PathStatus struct {
	Name string     `json:"name"`
	Dev  string     `json:"dev"`
	EID  netip.Addr `json:"eid"`
	RLOC netip.Addr `json:"rloc,omitzero"`
	Up   bool       `json:"up"`
	// Reason says why a path is down: "link down", or "rloc probe" when
	// every locator probed over it stopped answering.
	Reason string `json:"reason,omitempty"`
	// Probes are the locators RLOC-probed over the path.
	Probes []RLOCProbe `json:"rloc_probes,omitempty"`
	// LISP counts what the LISP datapath encapsulated onto the path (Tx)
	// and decapsulated from it (Rx), inner bytes; absent without --lisp.
	LISP *PathBytes `json:"lisp,omitempty"`
}

// State is the path's state for a status table: "up", or "down" with its
// reason ("down: rloc probe").
func (p PathStatus) State() string {
	switch {
	case p.Up:
		return "up"
	case p.Reason != "":
		return "down: " + p.Reason
	}
	return "down"
}

// PathBytes are one path's datapath counters.
type PathBytes struct {
	TxBytes   uint64 `json:"tx_bytes"`
	TxPackets uint64 `json:"tx_packets"`
	RxBytes   uint64 `json:"rx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
}

// PathCounter is a Pinner that counts each path's traffic (the LISP
// datapath's per-path counters).
type PathCounter interface {
	PathBytes() (map[int]PathBytes, error)
}

// SubflowStatus is one subflow as status shows it.
type SubflowStatus struct {
	Path   string `json:"path"` // the path whose EID is the subflow's source ("" if none)
	Local  string `json:"local"`
	Remote string `json:"remote"`
	// RLOC is the locator the path carries this destination's subflow to.
	RLOC string `json:"rloc,omitempty"`
	// BytesSent counts bytes sent on the subflow and acked (tcpi_bytes_acked).
	BytesSent uint64 `json:"bytes_sent"`
	// BytesReceived counts bytes received on it (tcpi_bytes_received).
	BytesReceived uint64 `json:"bytes_received"`
	State         string `json:"state"`
}

// ConnStatus is one intercepted connection as status shows it.
type ConnStatus struct {
	ID     uint64 `json:"id"`
	Client string `json:"client"`
	Dest   string `json:"dest"`
	Mode   Mode   `json:"mode"`
	// Why says why a connection is native or fell back to TCP.
	Why      string     `json:"why,omitempty"`
	EID      string     `json:"eid_prefix,omitempty"`
	Locators []Locator  `json:"locators,omitempty"`
	Token    string     `json:"token,omitempty"`
	Open     bool       `json:"open"`
	Opened   time.Time  `json:"opened"`
	Closed   *time.Time `json:"closed,omitempty"`
	// Subflows of an MPTCP connection (live ones, then those closed).
	Subflows []SubflowStatus `json:"subflows,omitempty"`
	// PlannedPaths is how many paths an MPTCP connection's plan gives it
	// (one subflow each, whatever their state now).
	PlannedPaths int `json:"planned_paths,omitempty"`
	// EstablishedPaths is how many of them carry a live subflow on a path
	// that is up (for a closed connection: when it was last read open).
	EstablishedPaths int `json:"established_paths,omitempty"`
	// Missing says, for each planned path without a live subflow, why.
	Missing []MissingPath `json:"missing,omitempty"`
	// ToServer and ToClient are the bytes spliced each way (when closed).
	ToServer uint64 `json:"to_server"`
	ToClient uint64 `json:"to_client"`
}

// MissingPath is a planned path a connection has no live subflow on, and
// why: "path down", "join sent 5s ago, no answer", "refused: ...".
type MissingPath struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

func tcpState(s uint8) string {
	names := []string{"", "established", "syn-sent", "syn-recv", "fin-wait1", "fin-wait2", "time-wait", "close", "close-wait", "last-ack", "listen", "closing"}
	if int(s) < len(names) && s != 0 {
		return names[s]
	}
	return fmt.Sprintf("state-%d", s)
}

func (e *Engine) subflowStatus(sf SubflowInfo) SubflowStatus {
	s := SubflowStatus{
		Local: sf.Local.String(), Remote: sf.Remote.String(),
		BytesSent: sf.BytesAcked, BytesReceived: sf.BytesReceived, State: tcpState(sf.State),
	}
	if i := e.cfg.PathByEID(sf.Local.Addr()); i >= 0 {
		s.Path = e.cfg.Paths[i].Name
	}
	return s
}

// note merges one reading of a subflow into c.seen: counters only grow
// (a closed subflow reads zero or vanishes), the state is the latest unless
// sticky was set by the gateway closing it.
func (c *conn) note(s SubflowStatus, sticky bool) {
	for i := range c.seen {
		o := &c.seen[i]
		if o.Local != s.Local || o.Remote != s.Remote {
			continue
		}
		o.BytesSent, o.BytesReceived = max(o.BytesSent, s.BytesSent), max(o.BytesReceived, s.BytesReceived)
		if s.RLOC != "" {
			o.RLOC = s.RLOC
		}
		if sticky || !strings.HasPrefix(o.State, "closed:") {
			o.State = s.State
		}
		return
	}
	c.seen = append(c.seen, s)
}

func (e *Engine) statusOf(c *conn) ConnStatus {
	st := ConnStatus{
		ID: c.id, Client: c.client.String(), Dest: c.dest.String(), Mode: c.mode, Why: c.why,
		Open: true, Opened: c.opened, ToServer: c.toServer.Load(), ToClient: c.toClient.Load(),
	}
	if c.rec.EID.IsValid() {
		st.EID, st.Locators = c.rec.EID.String(), c.rec.Locators
	}
	if c.mode == ModeMPTCP || c.mode == ModeTCPFallback {
		if c.mode == ModeMPTCP {
			st.Token = fmt.Sprintf("%08x", c.token)
		}
		plan := PlanFor(c.rec, nil, e.find)
		rloc := map[int]string{}
		for _, sf := range plan.Subflows {
			rloc[sf.Path] = sf.Locator.Addr.String()
		}
		var sfs []SubflowInfo
		var err error
		if c.mode == ModeMPTCP {
			sfs, err = e.subflows(c.up)
		} else if e.tcpInfo != nil {
			/* fell back: the one TCP connection, on the initial subflow's path */
			var sf SubflowInfo
			if sf, err = e.tcpInfo(c.up); err == nil {
				sfs = []SubflowInfo{sf}
			}
		}
		e.mu.Lock()
		if err == nil {
			for _, sf := range sfs {
				if sf.Remote.Port() == 0 {
					continue /* a subflow whose creation failed, lingering */
				}
				s := e.subflowStatus(sf)
				s.RLOC = rloc[e.cfg.PathByEID(sf.Local.Addr())]
				c.note(s, false)
			}
			if c.mode == ModeMPTCP && !c.finished.Load() {
				c.paths = e.pathsOf(c, mergePlans(c.plan, plan.Subflows), sfs)
			}
		}
		st.Subflows = append([]SubflowStatus(nil), c.seen...)
		if k := c.kept; k != nil {
			for i := range st.Subflows {
				for _, sf := range k.sfs {
					if st.Subflows[i].Local == sf.Local.String() && !strings.HasPrefix(st.Subflows[i].State, "closed:") {
						st.Subflows[i].State = "kept: last subflow (" + k.why + ")"
					}
				}
			}
		}
		st.PlannedPaths, st.EstablishedPaths = c.paths.planned, c.paths.established
		st.Missing = append([]MissingPath(nil), c.paths.missing...)
		e.mu.Unlock()
	}
	return st
}

// mergePlans is the subflows of a, then those of b on paths a has none on.
func mergePlans(a, b []Subflow) []Subflow {
	out := append([]Subflow(nil), a...)
	for _, sf := range b {
		if !slices.ContainsFunc(out, func(o Subflow) bool { return o.Path == sf.Path }) {
			out = append(out, sf)
		}
	}
	return out
}

// pathsOf counts c's planned paths and those with a live subflow, and
// says why each missing one is missing; e.mu is held.
func (e *Engine) pathsOf(c *conn, plan []Subflow, sfs []SubflowInfo) pathCount {
	live := map[int]bool{}
	for _, sf := range sfs {
		if i := e.cfg.PathByEID(sf.Local.Addr()); i >= 0 && sf.State == 1 && sf.Remote.Port() != 0 {
			live[i] = true
		}
	}
	pc := pathCount{planned: len(plan)}
	now := time.Now()
	for _, sf := range plan {
		i := sf.Path
		if live[i] && e.pathUp[i] && !e.probeDown[ProbeKey{Path: i, RLOC: sf.Locator.Addr}] {
			pc.established++
			continue
		}
		var why string
		j := c.joins[i]
		switch {
		case !e.pathUp[i]:
			why = "path down"
			if c.kept != nil && c.kept.path == i {
				why += "; its subflow is kept, the connection's last, until another path joins"
			}
		case e.probeDown[ProbeKey{Path: i, RLOC: sf.Locator.Addr}]:
			why = "locator " + sf.Locator.Addr.String() + " down (rloc probe)"
		case j == nil:
			why = "no join asked"
		case j.state == joinWaiting:
			why = "waiting for the connection to be fully established (the server's first data) to join"
		case j.state == joinSent && now.Sub(j.since) < joinAnswer:
			why = "joining"
		case j.state == joinSent:
			why = fmt.Sprintf("join sent %s ago, no answer", now.Sub(j.since).Round(time.Second))
		case j.state == joinFailed:
			why = j.why
		default:
			why = "closed"
		}
		pc.missing = append(pc.missing, MissingPath{Path: e.cfg.Paths[i].Name, Reason: why})
	}
	return pc
}

// Status lists the paths, the open connections (by id) and the last
// finished ones.
func (e *Engine) Status() ([]PathStatus, []ConnStatus) {
	e.mu.Lock()
	paths := make([]PathStatus, len(e.cfg.Paths))
	for i, p := range e.cfg.Paths {
		paths[i] = PathStatus{Name: p.Name, Dev: p.Dev, EID: p.EID, RLOC: p.RLOC, Up: e.pathUp[i]}
		if !e.pathUp[i] {
			paths[i].Reason = "link down"
		}
	}
	/* a path whose every probed locator is down is down, whatever its
	   link says */
	probed, down := map[int]int{}, map[int]int{}
	for k, d := range e.probeDown {
		if d {
			down[k.Path]++
		}
	}
	open := make([]*conn, 0, len(e.conns))
	for _, c := range e.conns {
		open = append(open, c)
	}
	closed := append([]ConnStatus(nil), e.closed...)
	e.mu.Unlock()
	if e.prober != nil {
		for i := range paths {
			paths[i].Probes = e.prober.Status(i)
			probed[i] = len(paths[i].Probes)
		}
	}
	for i := range paths {
		if paths[i].Up && down[i] > 0 && down[i] >= probed[i] {
			paths[i].Up, paths[i].Reason = false, "rloc probe"
		}
	}
	if pc, ok := e.pin.(PathCounter); ok {
		if pb, err := pc.PathBytes(); err == nil {
			for i := range paths {
				b := pb[i]
				paths[i].LISP = &b
			}
		} else {
			e.rl.Warn("pathstats", "gateway: reading the datapath's path counters", "err", err)
		}
	}
	sort.Slice(open, func(i, j int) bool { return open[i].id < open[j].id })
	var out []ConnStatus
	out = append(out, closed...)
	for _, c := range open {
		out = append(out, e.statusOf(c))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return paths, out
}

// Counters returns a copy of the engine's counters, with
// infrastructure_dropped: the users' packets to infrastructure addresses
// the nftables table dropped.
func (e *Engine) Counters() map[string]uint64 {
	var infra uint64
	var infraErr error
	if e.infraDropped != nil {
		if infra, infraErr = e.infraDropped(); infraErr != nil {
			e.rl.Warn("infra-counter", "gateway: reading the infrastructure drop counter", "err", infraErr)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]uint64, len(e.counters)+1)
	if e.infraDropped != nil && infraErr == nil {
		out["infrastructure_dropped"] = infra
	}
	for k, v := range e.counters {
		out[k] = v
	}
	if e.prober != nil {
		for k, v := range e.prober.Counters() {
			out[k] = v
		}
	}
	for k, v := range e.listeners.Counters("intercept") {
		if k != "open" && k != "accepted" && k != "refused_per_source" { // per client: refused_per_client
			out["listener_"+k] = v
		}
	}
	return out
}
