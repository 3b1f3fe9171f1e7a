package controller

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/store"
)

// embeddedStore starts an embedded etcd with o for the test and dials it.
func embeddedStore(t testing.TB, o EtcdOptions) *store.Etcd {
	t.Helper()
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	e, err := EmbeddedEtcdWith(t.TempDir(), client, "", peer, pki.Files{}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	s, err := store.DialEtcd([]string{client})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rewrite puts n values of size bytes, over keys keys, from 8 writers.
func rewrite(t *testing.T, s store.Store, prefix string, keys, n, size int) error {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	val := bytes.Repeat([]byte("x"), size)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				if err := s.Put(context.Background(), fmt.Sprintf("%s%d", prefix, i%keys), val); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Every rewrite of a key is a revision etcd keeps until compacted: 3,000
// rewrites of 8 keys of 8 KiB make a database of tens of MiB though 64 KiB
// are live. The maintainer compacts (keeping 100 revisions here) and
// defragments, and the file is back to a few MiB.
func TestCompactionAndDefragmentationKeepTheStoreSmall(t *testing.T) {
	s := embeddedStore(t, EtcdOptions{NoFsync: true, Retain: 1 << 40})
	if err := rewrite(t, s, "/onehop/test/", 8, 3000, 8<<10); err != nil {
		t.Fatal(err)
	}
	m := NewStoreMaintainer(s, 100, slog.New(slog.DiscardHandler))
	m.DefragFree = 1 << 20
	before, err := s.Health(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if before.DBSize < 16<<20 {
		t.Fatalf("the database is only %d bytes after 3,000 rewrites: the test writes too little to show anything", before.DBSize)
	}
	st, err := m.Once(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before: %d bytes (%d in use); after: %d bytes (%d in use), compacted to %d, %d defrags",
		before.DBSize, before.DBSizeInUse, st.DBSize, st.DBSizeInUse, st.CompactedRevision, st.Defrags)
	if st.CompactedRevision != before.Revision-100 || st.Defrags != 1 {
		t.Fatalf("compacted to %d (want %d), %d defragmentations (want 1)", st.CompactedRevision, before.Revision-100, st.Defrags)
	}
	if st.DBSize > 4<<20 || st.DBSize > before.DBSize/4 {
		t.Fatalf("database %d bytes after compaction and defragmentation (was %d): want at most 4 MiB", st.DBSize, before.DBSize)
	}
	// A second look finds nothing to do: no defragmentation for little.
	if st, err = m.Once(t.Context()); err != nil || st.Defrags != 1 {
		t.Fatalf("second pass: %d defrags (want still 1), err %v", st.Defrags, err)
	}
}

// An etcd over its quota raises NOSPACE and refuses writes: the maintainer
// reports it (status, metric, an error logged once), makes room, clears it,
// and writes resume.
func TestANoSpaceAlarmIsReportedAndClearedOnceThereIsRoom(t *testing.T) {
	s := embeddedStore(t, EtcdOptions{NoFsync: true, Quota: 4 << 20, Retain: 1 << 40})
	err := rewrite(t, s, "/onehop/test/", 8, 4000, 8<<10)
	if err == nil || !strings.Contains(err.Error(), "database space exceeded") {
		t.Fatalf("writing 32 MiB under a 4 MiB quota: %v, want etcd's database space exceeded", err)
	}
	var logs bytes.Buffer
	m := NewStoreMaintainer(s, 0, slog.New(slog.NewTextHandler(&logs, nil)))
	c, _ := newController()
	c.SetStoreMaintainer(m)
	// Seen, not yet acted on: compaction is etcd's here (Retain 0), so the
	// file stays full and the alarm stays.
	st, err := m.Once(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !st.NoSpace || st.Quota != 4<<20 {
		t.Fatalf("status %+v: want NOSPACE reported with the 4 MiB quota", st)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "NOSPACE") {
		t.Fatalf("no error logged for NOSPACE: %q", logs.String())
	}
	srv := httptest.NewServer(c.API())
	defer srv.Close()
	if got := metric(t, srv.URL, `onehop_etcd_alarm{alarm="NOSPACE"}`); got != "1" {
		t.Fatalf(`onehop_etcd_alarm{alarm="NOSPACE"} = %q, want 1`, got)
	}
	if out := mustCall(t, srv, "GET", "/v1/store", "", 200); out["noSpace"] != true {
		t.Fatalf("GET /v1/store: %v, want noSpace", out)
	}
	// Room made: compaction to now and a defragmentation; the alarm goes.
	m.Retain = 1
	if st, err = m.Once(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st.NoSpace {
		t.Fatalf("after compaction and defragmentation: %+v, want the alarm cleared", st)
	}
	if err := s.Put(t.Context(), "/onehop/test/after", []byte("x")); err != nil {
		t.Fatalf("a write after the alarm was cleared: %v", err)
	}
	if got := metric(t, srv.URL, `onehop_etcd_alarm{alarm="NOSPACE"}`); got != "0" {
		t.Fatalf(`onehop_etcd_alarm{alarm="NOSPACE"} = %q after clearing, want 0`, got)
	}
	if !strings.Contains(logs.String(), "NOSPACE alarm cleared") {
		t.Fatalf("the clearing is not logged: %q", logs.String())
	}
}

// metric reads one sample's value from the controller's /metrics; a
// missing sample fails the test (absent is not zero).
func metric(t *testing.T, url, sample string) string {
	t.Helper()
	resp, err := httptestGet(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(resp, "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			return v
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", sample, resp)
	return ""
}

func httptestGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
