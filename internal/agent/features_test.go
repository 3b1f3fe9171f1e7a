package agent

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Every map the programs define is declared by exactly one registered
// feature, as reconciled or with the lifetime that bounds it: a new map
// without an owner fails here.
func TestEveryDatapathMapIsDeclaredByOneFeature(t *testing.T) {
	names, err := datapath.MapNames()
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, store.NewMemory(), &fakeDatapath{}, fakeInterfaces{})
	declared := map[string]string{}
	for _, f := range a.Features() {
		for _, m := range f.Maps() {
			declared[m.Name] = f.Name()
		}
	}
	for _, name := range names {
		if declared[name] == "" {
			t.Errorf("map %s is declared by no feature", name)
		}
		delete(declared, name)
	}
	for name, f := range declared {
		t.Errorf("feature %s declares map %s, which the programs do not define", f, name)
	}
}

// A full map is an error the operator sees (status, error text), never a
// random subset written: the datapath is not asked to write anything.
func TestAFullMapIsReportedAndNothingIsWritten(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	dp := &fakeDatapath{caps: map[string]int{"endpoints": 1}}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	_, err := a.ReconcileOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "endpoints: 2 entries wanted, capacity 1 (1 did not fit)") {
		t.Fatalf("reconcile error %v, want it to name the full map", err)
	}
	if dp.applies != 0 {
		t.Fatalf("the datapath was asked to write %d times with a map too small", dp.applies)
	}
	var st intent.AgentStatus
	if err := store.GetJSON(ctx, s, intent.StatusPrefix+"h1", &st); err != nil {
		t.Fatal(err)
	}
	want := []intent.MapOverflow{{Feature: "router", Map: "endpoints", Want: 2, Capacity: 1}}
	if !reflect.DeepEqual(st.Overflows, want) || !strings.Contains(st.Error, "map full") {
		t.Fatalf("status overflows %+v error %q, want %+v", st.Overflows, st.Error, want)
	}
	// And the metric says it too.
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(a))
	if over := gaugeValue(t, reg, "onehop_map_overflow_entries", "endpoints"); over != 1 {
		t.Fatalf("onehop_map_overflow_entries{map=endpoints} = %v, want 1", over)
	}
	if over := gaugeValue(t, reg, "onehop_map_overflow_entries", "vifs"); over != 0 {
		t.Fatalf("onehop_map_overflow_entries{map=vifs} = %v, want 0", over)
	}
}

// gaugeValue reads one labelled sample of a gauge from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, mapName string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "map" && l.GetValue() == mapName {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{map=%q} in the metrics", name, mapName)
	return 0
}

// stubFeature is a feature with a bit, whose use and failures a test sets.
type stubFeature struct {
	name    string
	bit     uint32
	inUse   bool
	failing error
	delay   time.Duration // how long a sync takes
	log     *[]string
	mu      *sync.Mutex
}

type stubPlan struct{ inUse bool }

func (p stubPlan) Sizes() feature.Sizes { return feature.Sizes{} }
func (p stubPlan) InUse() bool          { return p.inUse }

func (f *stubFeature) Name() string        { return f.name }
func (f *stubFeature) Bit() uint32         { return f.bit }
func (f *stubFeature) Maps() []feature.Map { return nil }
func (f *stubFeature) Compile(feature.Node) (feature.Plan, error) {
	if f.failing != nil {
		return nil, f.failing
	}
	return stubPlan{f.inUse}, nil
}
func (f *stubFeature) Sync(p feature.Plan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.log = append(*f.log, fmt.Sprintf("sync %s inUse=%v", f.name, p.InUse()))
	time.Sleep(f.delay)
	return nil
}

// loggingDatapath records SetFeatures in the same log as the stub's syncs.
type loggingDatapath struct {
	fakeDatapath
	log *[]string
	mu  *sync.Mutex
}

func (d *loggingDatapath) SetFeatures(bits uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	*d.log = append(*d.log, fmt.Sprintf("bits %#x", bits))
	return nil
}

// A feature's bit is set only once its maps are written, and cleared
// before they are emptied; a failing feature stops no other.
// agentWithStubs is an agent on h1's desired state whose registry starts
// with stubs; the stubs' syncs and the datapath's SetFeatures go, in order,
// into the log returned.
func agentWithStubs(t *testing.T, stubs ...*stubFeature) (*Agent, *loggingDatapath, *[]string) {
	t.Helper()
	s := store.NewMemory()
	putDesired(t, s, "h1", desired())
	log := &[]string{}
	mu := &sync.Mutex{}
	dp := &loggingDatapath{log: log, mu: mu}
	a := newAgent(t, s, dp, fakeInterfaces{"uplink0": 2, "vif-web1": 5, "vif-web3": 6})
	var fs []feature.Feature
	for _, f := range stubs {
		f.log, f.mu = log, mu
		fs = append(fs, f)
		a.subs[f.name] = &subController{}
	}
	a.features = append(fs, a.features...)
	if err := feature.Check(a.features); err != nil {
		t.Fatal(err)
	}
	return a, dp, log
}

// A feature's bit is set only once its maps are written, and cleared
// before they are emptied; a failing feature stops no other.
func TestFeatureBitsFollowTheirMapsAndFeaturesFailAlone(t *testing.T) {
	ctx := context.Background()
	tap := &stubFeature{name: "stage", bit: 1 << 8, inUse: true}
	broken := &stubFeature{name: "broken", bit: 1 << 9, failing: errors.New("bad intent")}
	a, dp, log := agentWithStubs(t, tap, broken)

	_, err := a.ReconcileOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "broken: bad intent") {
		t.Fatalf("reconcile error %v, want the broken feature's", err)
	}
	if dp.applies != 1 {
		t.Fatalf("the router synced %d times beside a broken feature, want 1", dp.applies)
	}
	if want := []string{"sync stage inUse=true", "bits 0x100"}; !reflect.DeepEqual(*log, want) {
		t.Fatalf("first pass did %v, want %v (the bit after the maps)", *log, want)
	}
	*log = nil
	tap.inUse = false
	a.ReconcileOnce(ctx)
	if want := []string{"bits 0x0", "sync stage inUse=false"}; !reflect.DeepEqual(*log, want) {
		t.Fatalf("second pass did %v, want %v (the bit cleared before the maps)", *log, want)
	}
}

// A pass that runs out of time starts no further sync: the features after
// a slow one are left, failed, for the next pass, and their bits stay off.
func TestAPassOutOfTimeLeavesTheRestForTheNextPass(t *testing.T) {
	slow := &stubFeature{name: "slow", bit: 1 << 8, inUse: true}
	after := &stubFeature{name: "after", bit: 1 << 9, inUse: true}
	a, dp, log := agentWithStubs(t, slow, after)
	if _, err := a.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	*log = nil
	after.inUse = false
	slow.delay = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := a.pass(ctx, "resync", 0)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "after: not synced") {
		t.Fatalf("pass error %v, want the features after the slow one not synced", err)
	}
	// The bit of a feature going out of use is cleared before any sync;
	// nothing is synced after the deadline, the router's Apply included.
	if want := []string{"bits 0x100", "sync slow inUse=true"}; !reflect.DeepEqual(*log, want) {
		t.Fatalf("pass out of time did %v, want %v", *log, want)
	}
	if dp.applies != 1 {
		t.Fatalf("the router synced %d times, want once (the first pass)", dp.applies)
	}

	*log = nil
	slow.delay = 0
	if _, err := a.pass(context.Background(), "resync", 0); err != nil {
		t.Fatalf("the next pass: %v", err)
	}
	if want := []string{"sync slow inUse=true", "sync after inUse=false"}; !reflect.DeepEqual(*log, want) {
		t.Fatalf("the next pass did %v, want %v", *log, want)
	}
	if dp.applies != 2 {
		t.Fatalf("the router synced %d times, want twice", dp.applies)
	}
}

func TestARegistryWithTwoFeaturesOnOneBitIsRefused(t *testing.T) {
	var log []string
	var mu sync.Mutex
	fs := []feature.Feature{&stubFeature{name: "a", bit: 4, log: &log, mu: &mu}, &stubFeature{name: "b", bit: 4, log: &log, mu: &mu}}
	if err := feature.Check(fs); err == nil {
		t.Fatal("two features on one bit accepted")
	}
}
