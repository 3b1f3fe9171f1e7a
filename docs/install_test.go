package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// installTree runs `make install` (and then make ARGS...) with a stand-in
// binary, so no build is timed here: `-o build` takes the build target as
// done, and BIN names the stand-in.
func installTree(t *testing.T, vars []string, then ...string) {
	t.Helper()
	testenv.RequireTool(t, "make")
	bin := filepath.Join(t.TempDir(), "onehop")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, target := range append([]string{"install"}, then...) {
		cmd := exec.Command("make", append([]string{"-s", "-o", "build", target, "BIN=" + bin}, vars...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s %s: %v\n%s", target, strings.Join(vars, " "), err, out)
		}
	}
}

// mode returns path's permission bits, failing when it is missing.
func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("make install: %v", err)
	}
	return fi.Mode().Perm()
}

// `make install` puts the binary, the units (pointed at the binary's
// PREFIX), the CNI plugin's link and the example settings under DESTDIR;
// a second install keeps the operator's settings; `make uninstall` removes
// the binary, units and link and leaves /etc/onehop alone.
func TestMakeInstallPutsTheBinaryUnitsAndSettingsInPlace(t *testing.T) {
	dest := t.TempDir()
	vars := []string{"DESTDIR=" + dest, "PREFIX=/opt/onehop"}
	installTree(t, vars)
	bin := filepath.Join(dest, "opt/onehop/bin/onehop")
	if m := mode(t, bin); m != 0o755 {
		t.Errorf("%s: mode %o, want 755", bin, m)
	}
	for _, u := range []string{"onehop-controller.service", "onehop-agent.service"} {
		path := filepath.Join(dest, "opt/onehop/lib/systemd/system", u)
		if m := mode(t, path); m != 0o644 {
			t.Errorf("%s: mode %o, want 644", path, m)
		}
		b, _ := os.ReadFile(path)
		if !strings.Contains(string(b), "ExecStart=/opt/onehop/bin/onehop ") || !strings.Contains(string(b), "Type=notify") {
			t.Errorf("%s: ExecStart is not /opt/onehop/bin/onehop, or the unit is not Type=notify:\n%s", path, b)
		}
	}
	// The CNI plugin's link, where runtimes look, naming the installed
	// binary as it will be once DESTDIR is the root.
	plugin := filepath.Join(dest, "opt/cni/bin/onehop")
	if target, err := os.Readlink(plugin); err != nil || target != "/opt/onehop/bin/onehop" {
		t.Errorf("%s: link to %q (%v), want /opt/onehop/bin/onehop", plugin, target, err)
	}
	settings := filepath.Join(dest, "etc/onehop")
	if m := mode(t, settings); m != 0o700 {
		t.Errorf("%s: mode %o, want 700", settings, m)
	}
	for _, e := range []string{"controller.env", "agent.env"} {
		if m := mode(t, filepath.Join(settings, e)); m != 0o600 {
			t.Errorf("%s: mode %o, want 600", e, m)
		}
	}
	mine := []byte("ONEHOP_NODE=mine\n")
	if err := os.WriteFile(filepath.Join(settings, "agent.env"), mine, 0o600); err != nil {
		t.Fatal(err)
	}
	installTree(t, vars, "uninstall")
	if b, _ := os.ReadFile(filepath.Join(settings, "agent.env")); string(b) != string(mine) {
		t.Errorf("a second install replaced the operator's agent.env with:\n%s", b)
	}
	for _, gone := range []string{bin, filepath.Join(dest, "opt/onehop/lib/systemd/system/onehop-agent.service"), plugin} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("after make uninstall: %s: %v, want it gone", gone, err)
		}
	}
	if _, err := os.Stat(filepath.Join(settings, "controller.env")); err != nil {
		t.Errorf("make uninstall removed the settings: %v", err)
	}
}

// The installed units pass systemd's own check: installed under a PREFIX
// with no DESTDIR, so their ExecStart names a file that exists.
func TestTheInstalledUnitsPassSystemdAnalyzeVerify(t *testing.T) {
	testenv.RequireTool(t, "systemd-analyze")
	prefix := t.TempDir()
	installTree(t, []string{"PREFIX=" + prefix, "SYSCONFDIR=" + filepath.Join(prefix, "etc"), "CNIBINDIR=" + filepath.Join(prefix, "cni")})
	units, _ := filepath.Glob(filepath.Join(prefix, "lib/systemd/system/*.service"))
	if len(units) != 2 {
		t.Fatalf("installed units %v, want 2", units)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
