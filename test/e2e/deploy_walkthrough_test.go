package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// walkSection is the section of docs/deploy.md this test runs.
const walkSection = "## Three hosts from nothing"

// walkStep is one fenced sh block of the walkthrough: the hosts its first
// line names (# on h1, h2), its script, and the text block after it, whose
// lines its output must hold in order ("..." matches anything).
type walkStep struct {
	line  int // in docs/deploy.md, for messages
	hosts []string
	body  string
	want  []string
}

var onHosts = regexp.MustCompile(`^# on (h\d+(?:, h\d+)*)$`)

// parseWalkthrough reads the steps of walkSection from a markdown page.
// Blocks without "# on ..." (examples, XML) are not run.
func parseWalkthrough(doc string) ([]walkStep, error) {
	lines := strings.Split(doc, "\n")
	start := slices.Index(lines, walkSection)
	if start < 0 {
		return nil, fmt.Errorf("no %q section", walkSection)
	}
	var steps []walkStep
	for i := start + 1; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "## ") {
			break // the next section
		}
		info, ok := strings.CutPrefix(l, "```")
		if !ok {
			continue
		}
		open := i
		var body []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			return nil, fmt.Errorf("docs/deploy.md:%d: a fenced block that never closes", open+1)
		}
		switch {
		case info == "sh" && len(body) > 0 && onHosts.MatchString(body[0]):
			m := onHosts.FindStringSubmatch(body[0])
			steps = append(steps, walkStep{line: open + 1, hosts: strings.Split(m[1], ", "), body: strings.Join(body[1:], "\n") + "\n"})
		case info == "text" && len(steps) > 0 && steps[len(steps)-1].want == nil:
			for _, w := range body {
				if w = strings.TrimSpace(w); w != "" {
					steps[len(steps)-1].want = append(steps[len(steps)-1].want, w)
				}
			}
		}
	}
	return steps, nil
}

// matchLines checks that out holds every want line, in order, each within
// one line of out, "..." in a want line standing for anything.
func matchLines(out string, want []string) error {
	got := strings.Split(out, "\n")
	j := 0
	for _, w := range want {
		parts := strings.Split(w, "...")
		for ; j < len(got); j++ {
			if containsInOrder(got[j], parts) {
				break
			}
		}
		if j == len(got) {
			return fmt.Errorf("no line like %q (after the lines matched before it)", w)
		}
		j++
	}
	return nil
}

func containsInOrder(s string, parts []string) bool {
	for _, p := range parts {
		p = strings.TrimSpace(p)
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// commandLine is the command starting with prefix in script, continuation
// lines joined, cut where its redirections or & start, ${X} written $X.
func commandLine(script, prefix string) []string {
	joined := strings.ReplaceAll(script, "\\\n", " ")
	for _, l := range strings.Split(joined, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		var out []string
		for _, f := range strings.Fields(l) {
			if strings.HasPrefix(f, "<") || strings.HasPrefix(f, ">") || f == "&" || strings.HasPrefix(f, "2>") {
				break
			}
			out = append(out, braces.ReplaceAllString(f, "$$$1"))
		}
		return out
	}
	return nil
}

var braces = regexp.MustCompile(`\$\{(\w+)\}`)

// unitExecStart is a unit file's ExecStart command line, the binary named
// by its base name, as commandLine gives a shell line.
func unitExecStart(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := commandLine(string(b), "ExecStart=")
	if len(cmd) == 0 {
		t.Fatalf("%s has no ExecStart", path)
	}
	cmd[0] = filepath.Base(strings.TrimPrefix(cmd[0], "ExecStart="))
	return cmd
}

// walkSteps are the steps of docs/deploy.md's walkthrough.
func walkSteps(t *testing.T) []walkStep {
	t.Helper()
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	steps, err := parseWalkthrough(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

func TestDeployWalkthroughDaemonsRunWhatTheUnitsRun(t *testing.T) {
	steps := walkSteps(t)
	var all strings.Builder
	for _, s := range steps {
		all.WriteString(s.body)
	}
	for _, c := range []struct{ unit, prefix string }{
		{"onehop-controller.service", "onehop controller "},
		{"onehop-agent.service", "onehop agent "},
	} {
		want := unitExecStart(t, filepath.Join("../../contrib/systemd", c.unit))
		got := commandLine(all.String(), c.prefix)
		if !slices.Equal(got, want) {
			t.Errorf("docs/deploy.md runs\n  %s\nbut %s's ExecStart is\n  %s", strings.Join(got, " "), c.unit, strings.Join(want, " "))
		}
	}
}

// walkHost is one simulated host: a network namespace with its own mount
// and UTS namespaces, held by a process that sleeps in them.
type walkHost struct {
	name, netns string
	holder      *exec.Cmd
}

// walkHostSetup runs in a host's new mount and UTS namespaces: its own
// hostname; /etc, /var, /usr and /opt overlaid on the machine's (writes
// land in a tmpfs that goes with the namespace); an empty /run and /root;
// a /sys of its network namespace. Then it holds the namespaces.
const walkHostSetup = `
hostname "$1"
mount -t tmpfs -o mode=0700 tmpfs "$2"
for d in etc var usr opt; do
	mkdir "$2/$d.up" "$2/$d.work"
	mount -t overlay overlay -o "lowerdir=/$d,upperdir=$2/$d.up,workdir=$2/$d.work" "/$d"
done
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=0700 tmpfs /root
umount -l /sys
mount -t sysfs sysfs /sys
echo ready
exec sleep infinity
`

// walkPrelude starts every block: in root's home, and scp standing in for
// the copy between hosts (there is no ssh between namespaces): each file
// is tarred into the target host's mount namespace.
const walkPrelude = `cd /root
scp() {
	local dst=${@: -1} host dir f pid
	host=${dst%%:*}; host=${host#*@}; dir=${dst#*:}
	pid=WALK_PID_$host; pid=${!pid}
	[ -n "$pid" ] || { echo "scp: no host $host" >&2; return 1; }
	for f in "${@:1:$#-1}"; do
		tar -C "$(dirname "$f")" -cf - "$(basename "$f")" | nsenter --target "$pid" --mount -- tar -C "$dir" -xpf -
	done
}
`

const walkNetnsPrefix = "walk-"

func TestPrivilegedDeployWalkthroughThreeHostsFromNothing(t *testing.T) {
	needRoot(t)
	testenv.RequireTool(t, "qemu-system-x86_64", "cpio", "cnitool", "make", "nsenter", "unshare", "modprobe", "tar", "busybox")
	findGuestKernel(t)
	staticBusybox(t)
	steps := walkSteps(t)
	// The page must still walk what it promises, or a shortened page would
	// pass: a VM under QEMU on one host, a container by cnitool on another.
	scripts := map[string]string{}
	for _, s := range steps {
		for _, h := range s.hosts {
			scripts[h] += s.body
		}
	}
	if !strings.Contains(scripts["h2"], "qemu-system-x86_64") || !strings.Contains(scripts["h3"], "cnitool add") {
		t.Fatalf("the walkthrough no longer runs QEMU on h2 and cnitool add on h3 (%d steps)", len(steps))
	}

	removeWalkNamespaces(t) // a killed run's
	dir := t.TempDir()
	hosts := map[string]*walkHost{}
	var groups []int // process groups of the blocks: every process they started
	t.Cleanup(func() {
		stopGroups(t, groups)
		for _, h := range hosts {
			if h.holder != nil && h.holder.Process != nil {
				_ = h.holder.Process.Kill()
				_ = h.holder.Wait()
			}
		}
		removeWalkNamespaces(t)
	})

	// The fabric: a bridge in its own namespace, a veth to each host's eth0.
	fabric := walkNetnsPrefix + "fabric"
	mustRun(t, "ip", "netns", "add", fabric)
	mustRun(t, "ip", "-n", fabric, "link", "add", "br0", "type", "bridge")
	mustRun(t, "ip", "-n", fabric, "link", "set", "br0", "up")
	for i, name := range []string{"h1", "h2", "h3"} {
		h := &walkHost{name: name, netns: walkNetnsPrefix + name}
		hosts[name] = h
		mustRun(t, "ip", "netns", "add", h.netns)
		mustRun(t, "ip", "-n", h.netns, "link", "set", "lo", "up")
		mustRun(t, "ip", "link", "add", "eth0", "netns", h.netns, "type", "veth", "peer", "name", name, "netns", fabric)
		mustRun(t, "ip", "-n", fabric, "link", "set", name, "master", "br0", "up")
		mustRun(t, "ip", "-n", h.netns, "addr", "add", fmt.Sprintf("192.168.100.%d/24", i+1), "dev", "eth0")
		mustRun(t, "ip", "-n", h.netns, "link", "set", "eth0", "up")
		scratch := filepath.Join(dir, name)
		if err := os.Mkdir(scratch, 0o700); err != nil {
			t.Fatal(err)
		}
		h.holder = exec.Command("nsenter", "--net=/run/netns/"+h.netns, "--",
			"unshare", "--mount", "--uts", "--propagation", "private", "--",
			"sh", "-ec", walkHostSetup, "setup", name, scratch)
		h.holder.Stderr = os.Stderr
		out, err := h.holder.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := h.holder.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
			t.Fatalf("host %s: its namespaces were not set up (%q, %v)", name, line, err)
		}
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C"}
	for _, h := range hosts {
		env = append(env, fmt.Sprintf("WALK_PID_%s=%d", h.name, h.holder.Process.Pid))
	}
	// runOn runs a shell script on host h, in a process group of its own
	// that the cleanup kills with everything it left running.
	runOn := func(h *walkHost, what, script string, timeout time.Duration) (string, error) {
		f := filepath.Join(dir, fmt.Sprintf("step-%d.sh", len(groups)))
		if err := os.WriteFile(f, []byte(walkPrelude+script), 0o600); err != nil {
			t.Fatal(err)
		}
		outFile, err := os.Create(f + ".out")
		if err != nil {
			t.Fatal(err)
		}
		defer outFile.Close()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "nsenter", "--target", fmt.Sprint(h.holder.Process.Pid), "--mount", "--uts", "--net", "--",
			"env", "-i")
		cmd.Args = append(cmd.Args, env...)
		cmd.Args = append(cmd.Args, "bash", "-e", f)
		// A file, not a pipe: what the block leaves running in the
		// background keeps it open, and Wait must not wait for that.
		cmd.Stdout, cmd.Stderr = outFile, outFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, cmd.Process.Pid)
		err = cmd.Wait()
		b, _ := os.ReadFile(outFile.Name())
		if ctx.Err() != nil {
			err = fmt.Errorf("%s did not finish within %s", what, timeout)
		}
		return string(b), err
	}

	// make install on every host, into its own /usr/local, /etc and /opt.
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"h1", "h2", "h3"} {
		if out, err := runOn(hosts[name], "make install", fmt.Sprintf("make -s -C %s -o build install BIN=%s\n", repo, binary), time.Minute); err != nil {
			t.Fatalf("make install on %s: %v\n%s", name, err, out)
		}
	}

	start := time.Now()
	outputs := map[string]*strings.Builder{"h1": {}, "h2": {}, "h3": {}}
	for _, s := range steps {
		for _, name := range s.hosts {
			h := hosts[name]
			if h == nil {
				t.Fatalf("docs/deploy.md:%d: no host %s in the walkthrough", s.line, name)
			}
			t0 := time.Now()
			out, err := runOn(h, fmt.Sprintf("the block at docs/deploy.md:%d on %s", s.line, name), s.body, 2*time.Minute)
			t.Logf("docs/deploy.md:%d on %s (%.1f s):\n%s", s.line, name, time.Since(t0).Seconds(), out)
			if err != nil {
				t.Fatalf("docs/deploy.md:%d on %s: %v\n%s", s.line, name, err, out)
			}
			if err := matchLines(out, s.want); err != nil {
				t.Fatalf("docs/deploy.md:%d on %s: its output is not what the page shows: %v\n%s", s.line, name, err, out)
			}
			outputs[name].WriteString(out)
		}
	}
	t.Logf("the walkthrough ran in %.1f s after make install", time.Since(start).Seconds())

	// The exchange itself, asserted here too so that no edit of the page's
	// expected outputs can drop it: the guest (h2) pinged the container
	// and got its TCP answer; the container (h3) pinged the guest and got
	// its; h2's agent carries the guest on a tap.
	for _, c := range []struct{ host, want string }{
		{"h2", "lease 10.1.1.2/24 router 10.1.1.1"},
		{"h2", "3 packets transmitted, 3 packets received, 0% packet loss"},
		{"h2", "tcp: hello from ctr1"},
		{"h3", "3 packets transmitted, 3 received, 0% packet loss"},
		{"h3", "hello from qemu1"},
		{"h1", "tap vifs: tapq1"},
	} {
		if !strings.Contains(outputs[c.host].String(), c.want) {
			t.Errorf("no %q in what the blocks on %s printed", c.want, c.host)
		}
	}
}

// mustRun runs a command on the machine and fails the test if it fails.
func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// stopGroups ends every process of the blocks' process groups: SIGTERM,
// then SIGKILL to what is left after 5 s.
func stopGroups(t *testing.T, groups []int) {
	alive := func() []int {
		var left []int
		for _, g := range groups {
			if syscall.Kill(-g, 0) == nil {
				left = append(left, g)
			}
		}
		return left
	}
	for _, g := range alive() {
		_ = syscall.Kill(-g, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(alive()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, g := range alive() {
		_ = syscall.Kill(-g, syscall.SIGKILL)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(alive()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := alive(); len(left) > 0 {
		t.Errorf("process groups %v still have processes after SIGKILL", left)
	}
}

// removeWalkNamespaces kills what runs in the walkthrough's network
// namespaces and deletes them (its hosts' taps, veths, bpffs and etcd data
// go with them and with their mount namespaces).
func removeWalkNamespaces(t *testing.T) {
	entries, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Error(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), walkNetnsPrefix) {
			continue
		}
		if out, err := exec.Command("ip", "netns", "pids", e.Name()).Output(); err == nil {
			for _, p := range strings.Fields(string(out)) {
				var pid int
				if _, err := fmt.Sscan(p, &pid); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if out, err := exec.Command("ip", "netns", "delete", e.Name()).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v\n%s", e.Name(), err, out)
		}
	}
}
