package version

import (
	"runtime/debug"
	"testing"
)

func TestBPFDigestChangesWithAnyObjectAndNotWithOrder(t *testing.T) {
	a := digest(map[string][]byte{"vif": []byte("one"), "uplink": []byte("two")})
	if b := digest(map[string][]byte{"uplink": []byte("two"), "vif": []byte("one")}); a != b {
		t.Fatalf("same objects, digests %s and %s", a, b)
	}
	for name, objs := range map[string]map[string][]byte{
		"a byte changed":         {"vif": []byte("onf"), "uplink": []byte("two")},
		"an object renamed":      {"vif2": []byte("one"), "uplink": []byte("two")},
		"bytes moved across two": {"vif": []byte("on"), "uplink": []byte("etwo")},
		"an object missing":      {"vif": []byte("one")},
	} {
		if d := digest(objs); d == a {
			t.Errorf("%s: digest %s unchanged", name, d)
		}
	}
	if d := digest(nil); d != "none" {
		t.Errorf("no objects: digest %q, want none", d)
	}
}

func TestLinkTimeValuesWinOverTheToolchainStamp(t *testing.T) {
	stamp := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2024-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}
	i := Info{}
	fromBuildInfo(&i, stamp)
	if i.Commit != "0123456789ab-dirty" || i.Date != "2024-01-02T03:04:05Z" {
		t.Errorf("from the stamp: commit %q date %q, want 0123456789ab-dirty and the vcs.time", i.Commit, i.Date)
	}
	i = Info{Commit: "v1commit", Date: "2025-05-05"}
	fromBuildInfo(&i, stamp)
	if i.Commit != "v1commit" || i.Date != "2025-05-05" {
		t.Errorf("-ldflags -X values replaced by the stamp: %+v", i)
	}
}

func TestSameComparesReleaseCommitAndDatapathOnly(t *testing.T) {
	a := Info{Version: "v1", Commit: "c", Date: "d1", Go: "go1.24", BPF: "b"}
	b := a
	b.Date, b.Go = "d2", "go1.25"
	if !a.Same(b) || a.Mismatch(b) != "" {
		t.Errorf("rebuilt the same code: Same %v, mismatch %q", a.Same(b), a.Mismatch(b))
	}
	b.BPF = "x"
	if a.Same(b) || a.Mismatch(b) != "bpf x, not b" {
		t.Errorf("another datapath: Same %v, mismatch %q", a.Same(b), a.Mismatch(b))
	}
}

func TestThisBinaryHasAnIdentity(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Go == "" || i.BPF == "" {
		t.Fatalf("Get: %+v", i)
	}
}
