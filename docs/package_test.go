package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// `make package` builds a Debian package with dpkg-deb: the binary (which
// says the version it was packaged as), a man page per command, the
// bash/zsh/fish completions, the systemd units pointed at /usr/bin, the
// example settings as conffiles (mode 600 in a 700 directory) and the CNI
// plugin's link. dpkg-deb itself reads it back.
func TestMakePackageBuildsADebianPackageWithEverythingAnOperatorNeeds(t *testing.T) {
	testenv.RequireTool(t, "make", "go", "dpkg-deb", "gzip")
	out := t.TempDir()
	cmd := exec.Command("make", "-s", "package", "PKGDIR="+out, "VERSION=v1.2.3", "BIN="+filepath.Join(out, "onehop"))
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make package: %v\n%s", err, b)
	}
	deb := filepath.Join(out, "onehop_1.2.3_"+debArch(t)+".deb")
	if strings.TrimSpace(lastLine(string(b))) != deb {
		t.Fatalf("make package printed %q, want the package's path %s", b, deb)
	}

	info := dpkgDeb(t, "-I", deb)
	for _, want := range []string{"Package: onehop", "Version: 1.2.3", "Architecture: " + debArch(t), "Description: host-based network virtualization"} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb -I lacks %q:\n%s", want, info)
		}
	}
	if conf := dpkgDeb(t, "-f", deb, "Package"); strings.TrimSpace(conf) != "onehop" {
		t.Errorf("dpkg-deb -f Package: %q", conf)
	}

	// What is in it, path -> "mode owner" as dpkg-deb -c lists it.
	list := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(dpkgDeb(t, "-c", deb)), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("dpkg-deb -c: line %q", line)
		}
		list[strings.TrimPrefix(f[5], ".")] = f[0] + " " + f[1]
	}
	for path, want := range map[string]string{
		"/usr/bin/onehop": "-rwxr-xr-x root/root",
		"/lib/systemd/system/onehop-controller.service": "-rw-r--r-- root/root",
		"/lib/systemd/system/onehop-agent.service":      "-rw-r--r-- root/root",
		"/etc/onehop/":                                     "drwx------ root/root",
		"/etc/onehop/controller.env":                       "-rw------- root/root",
		"/etc/onehop/agent.env":                            "-rw------- root/root",
		"/opt/cni/bin/onehop":                              "lrwxrwxrwx root/root",
		"/usr/share/man/man1/onehop.1.gz":                  "-rw-r--r-- root/root",
		"/usr/share/man/man1/onehop-status.1.gz":           "-rw-r--r-- root/root",
		"/usr/share/man/man1/onehop-agent.1.gz":            "-rw-r--r-- root/root",
		"/usr/share/bash-completion/completions/onehop":    "-rw-r--r-- root/root",
		"/usr/share/zsh/vendor-completions/_onehop":        "-rw-r--r-- root/root",
		"/usr/share/fish/vendor_completions.d/onehop.fish": "-rw-r--r-- root/root",
	} {
		if got, ok := list[path]; !ok || got != want {
			t.Errorf("%s: %q (in the package: %v), want %q", path, got, ok, want)
		}
	}

	// Unpacked: the files say what they should.
	x := filepath.Join(t.TempDir(), "x")
	dpkgDeb(t, "-x", deb, x)
	ver, err := exec.Command(filepath.Join(x, "usr/bin/onehop"), "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(ver), "onehop v1.2.3 (commit ") || strings.Contains(string(ver), "commit unknown") {
		t.Errorf("the packaged binary's --version: %q (%v), want v1.2.3 with its commit", ver, err)
	}
	unit, _ := os.ReadFile(filepath.Join(x, "lib/systemd/system/onehop-agent.service"))
	if !strings.Contains(string(unit), "ExecStart=/usr/bin/onehop agent") {
		t.Errorf("the agent's unit does not start /usr/bin/onehop:\n%s", unit)
	}
	if link, _ := os.Readlink(filepath.Join(x, "opt/cni/bin/onehop")); link != "/usr/bin/onehop" {
		t.Errorf("the CNI plugin's link points at %q, want /usr/bin/onehop", link)
	}
	for file, want := range map[string]string{
		"usr/share/bash-completion/completions/onehop":    "__start_onehop",
		"usr/share/zsh/vendor-completions/_onehop":        "#compdef onehop",
		"usr/share/fish/vendor_completions.d/onehop.fish": "complete -c onehop",
	} {
		if b, _ := os.ReadFile(filepath.Join(x, file)); !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q: not a completion script", file, want)
		}
	}
	page, err := exec.Command("gzip", "-dc", filepath.Join(x, "usr/share/man/man1/onehop-status.1.gz")).Output()
	if err != nil || !strings.Contains(string(page), `.TH "ONEHOP" "1"`) || !strings.Contains(string(page), "output format") {
		t.Errorf("onehop-status.1 is not status's man page (%v):\n%.400s", err, page)
	}
	ctrl := filepath.Join(t.TempDir(), "ctrl")
	dpkgDeb(t, "-e", deb, ctrl)
	cf, _ := os.ReadFile(filepath.Join(ctrl, "conffiles"))
	if strings.TrimSpace(string(cf)) != "/etc/onehop/agent.env\n/etc/onehop/controller.env" {
		t.Errorf("conffiles:\n%s\nwant the two env files: an upgrade keeps the operator's settings", cf)
	}
	maintainerScripts(t, ctrl)
}

// The maintainer scripts do, with systemd running, what an operator
// expects of the units the package ships: reload on install, upgrade and
// removal; start nothing, restart nothing on an upgrade; stop both on
// removal (not on an upgrade); a purge drops the links that enabled them.
// They run against a fake systemctl that logs its arguments, under a
// DPKG_ROOT where systemd "runs".
func maintainerScripts(t *testing.T, ctrl string) {
	t.Helper()
	dir := t.TempDir()
	droot := filepath.Join(dir, "root")
	wants := filepath.Join(droot, "etc/systemd/system/multi-user.target.wants")
	for _, d := range []string{filepath.Join(droot, "run/systemd/system"), wants, filepath.Join(dir, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(dir, "systemctl.log")
	fake := "#!/bin/sh\necho \"$*\" >>" + log + "\n"
	if err := os.WriteFile(filepath.Join(dir, "bin/systemctl"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"onehop-agent.service", "onehop-controller.service"} {
		if err := os.Symlink("/lib/systemd/system/"+u, filepath.Join(wants, u)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		script string
		args   []string
		want   string // systemctl's calls, one a line
	}{
		{"postinst", []string{"configure", ""}, "--system daemon-reload"},
		{"postinst", []string{"configure", "1.2.2"}, "--system daemon-reload"},
		{"prerm", []string{"upgrade", "1.2.4"}, ""},
		{"prerm", []string{"remove"}, "--system stop onehop-agent.service onehop-controller.service"},
		{"postrm", []string{"upgrade", "1.2.4"}, ""},
		{"postrm", []string{"remove"}, "--system daemon-reload"},
		{"postrm", []string{"purge"}, "--system daemon-reload"},
	} {
		path := filepath.Join(ctrl, tc.script)
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v (%v), want an executable maintainer script", tc.script, fi, err)
			continue
		}
		os.Remove(log)
		cmd := exec.Command("sh", append([]string{path}, tc.args...)...)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"), "DPKG_ROOT="+droot)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s %v: %v\n%s", tc.script, tc.args, err, out)
		}
		got, _ := os.ReadFile(log)
		if strings.TrimSpace(string(got)) != tc.want {
			t.Errorf("%s %v called systemctl %q, want %q", tc.script, tc.args, got, tc.want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(wants, "onehop-*")); len(left) != 0 {
		t.Errorf("after a purge the units are still enabled: %v", left)
	}
}

// Two builds of the man pages are the same bytes: they are dated by the
// commit (SOURCE_DATE_EPOCH, which make man sets from git), not the day.
func TestMakeManIsReproducible(t *testing.T) {
	testenv.RequireTool(t, "make", "go", "git")
	out := t.TempDir()
	// Each build links the binary again (make man: build), stamped with
	// its own build time.
	build := func(mandir string, makeArgs ...string) map[string][]byte {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-s", "man", "MANDIR=" + mandir, "BIN=" + filepath.Join(out, "onehop")}, makeArgs...)...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make man: %v\n%s", err, b)
		}
		pages := map[string][]byte{}
		files, err := filepath.Glob(filepath.Join(mandir, "*.1"))
		if err != nil || len(files) < 10 {
			t.Fatalf("make man wrote %d pages into %s (%v)", len(files), mandir, err)
		}
		for _, f := range files {
			if pages[filepath.Base(f)], err = os.ReadFile(f); err != nil {
				t.Fatal(err)
			}
		}
		return pages
	}
	first, second := build(filepath.Join(out, "a")), build(filepath.Join(out, "b"))
	for name, b := range first {
		if !bytes.Equal(b, second[name]) {
			t.Errorf("%s differs between two builds:\n%.300s\n---\n%.300s", name, b, second[name])
		}
	}
	if len(first) != len(second) {
		t.Errorf("two builds wrote %d and %d pages", len(first), len(second))
	}
	git := exec.Command("git", "log", "-1", "--format=%cd", "--date=format-local:%b %Y")
	git.Dir = root
	git.Env = append(os.Environ(), "TZ=UTC", "LC_ALL=C")
	month, err := git.Output()
	if err != nil {
		t.Fatalf("git log: %v", err)
	}
	th := `.TH "ONEHOP" "1" "` + strings.TrimSpace(string(month)) + `"`
	if !bytes.Contains(first["onehop.1"], []byte(th)) {
		t.Errorf("onehop.1 is not dated by the commit: want %s in\n%.200s", th, first["onehop.1"])
	}
	if old := build(filepath.Join(out, "c"), "-o", "build", "SOURCE_DATE_EPOCH=86400"); !bytes.Contains(old["onehop.1"], []byte(`.TH "ONEHOP" "1" "Jan 1970"`)) {
		t.Errorf("SOURCE_DATE_EPOCH=86400 did not date onehop.1 January 1970:\n%.200s", old["onehop.1"])
	}
}

func dpkgDeb(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func debArch(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		t.Fatalf("dpkg --print-architecture: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
