// Package version says which onehop this is: its release, the commit and
// date it was built from, the Go that built it, and a digest of the eBPF
// objects it carries. The release, commit and date are set at link time
// (make build: -ldflags -X); a plain `go build` falls back to what the Go
// toolchain stamped (vcs.revision, vcs.time). Two binaries with the same
// Info run the same datapath: the controller compares the agents' with its
// own (`onehop status`).
//
// It is pure: the packages that embed BPF objects register them
// (RegisterBPF, from their init), so this package imports no kernel code.
package version

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
)

// Set at link time: go build -ldflags "-X github.com/onehop/onehop/internal/version.Version=v0.3.0 ...".
var (
	// Version is the release ("dev" when not built by make build or a package).
	Version = "dev"
	// Commit is the git commit built from; empty: the toolchain's vcs.revision.
	Commit = ""
	// Date is when it was built (RFC 3339); empty: the toolchain's vcs.time.
	Date = ""
)

// Info is one binary's identity, as `onehop version -o json`, GET
// /v1/version and each agent's status record carry it.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Date    string `json:"date,omitempty"`
	Go      string `json:"go"`
	// BPF is a digest of every embedded eBPF object (sha256 of their names
	// and bytes, hex, 16 digits): equal only when the datapaths are.
	BPF string `json:"bpf"`
}

// String is the one-line form: release, commit, date, Go, BPF digest.
func (i Info) String() string {
	commit, date := i.Commit, i.Date
	if commit == "" {
		commit = "unknown"
	}
	if date == "" {
		date = "unknown"
	}
	return fmt.Sprintf("onehop %s (commit %s, built %s, %s, bpf %s)", i.Version, commit, date, i.Go, i.BPF)
}

// Same reports whether a and b run the same code: release, commit and BPF
// objects (the Go and the build date may differ between two builds of it).
func (i Info) Same(o Info) bool {
	return i.Version == o.Version && i.Commit == o.Commit && i.BPF == o.BPF
}

var (
	mu      sync.Mutex
	objects = map[string][]byte{}
	cached  *Info
)

// RegisterBPF records an embedded eBPF object for the digest; each package
// that embeds one calls it from init with the bytes bpf2go embedded. A
// name registered twice is a programming error.
func RegisterBPF(name string, obj []byte) {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := objects[name]; ok {
		panic("version: BPF object " + name + " registered twice")
	}
	objects[name] = obj
	cached = nil
}

// BPFObjects lists the registered objects' names, sorted.
func BPFObjects() []string {
	mu.Lock()
	defer mu.Unlock()
	names := make([]string, 0, len(objects))
	for n := range objects {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Get returns this binary's Info.
func Get() Info {
	mu.Lock()
	defer mu.Unlock()
	if cached != nil {
		return *cached
	}
	i := Info{Version: Version, Commit: Commit, Date: Date, Go: runtime.Version(), BPF: digest(objects)}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fromBuildInfo(&i, bi.Settings)
	}
	cached = &i
	return i
}

// fromBuildInfo fills what -ldflags did not set from the toolchain's
// stamp; a tree with uncommitted changes is marked "-dirty", for it is
// not the commit it names.
func fromBuildInfo(i *Info, settings []debug.BuildSetting) {
	var rev, at string
	dirty := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if i.Commit == "" && rev != "" {
		i.Commit = rev
		if len(i.Commit) > 12 {
			i.Commit = i.Commit[:12]
		}
		if dirty {
			i.Commit += "-dirty"
		}
	}
	if i.Date == "" {
		i.Date = at
	}
}

// digest hashes objs in name order; "none" when there are none (a binary
// without a datapath).
func digest(objs map[string][]byte) string {
	if len(objs) == 0 {
		return "none"
	}
	names := make([]string, 0, len(objs))
	for n := range objs {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(objs[n]))
		h.Write(objs[n])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Mismatch says how o differs from i ("" when Same), for a person.
func (i Info) Mismatch(o Info) string {
	var d []string
	if i.Version != o.Version {
		d = append(d, fmt.Sprintf("version %s, not %s", o.Version, i.Version))
	}
	if i.Commit != o.Commit {
		d = append(d, fmt.Sprintf("commit %s, not %s", orUnknown(o.Commit), orUnknown(i.Commit)))
	}
	if i.BPF != o.BPF {
		d = append(d, fmt.Sprintf("bpf %s, not %s", o.BPF, i.BPF))
	}
	return strings.Join(d, "; ")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
