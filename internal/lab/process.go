package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/topology"
)

// Processes: the daemons a lab runs, the one place their arguments are
// built, and starting, stopping and watching them.

// controllerArgs are the arguments of the lab's controller.
func controllerArgs(st *State) []string {
	return []string{"controller",
		"--data-dir", filepath.Join(st.Dir, "etcd"),
		"--client-url", st.EtcdURL,
		"--socket", st.EtcdSocket,
		"--api-socket", st.APISocket,
		"--topology", st.Topology}
}

// agentArgs are the arguments of host's agent: every uplink, index 0 first
// (--uplink repeats), and the directory its slivers' cgroups are made in.
func agentArgs(st *State, t *topology.File, host string) []string {
	args := []string{"agent", "--node", host, "--etcd-endpoints", st.EtcdURL}
	h, _ := t.HostByName(host)
	for k := 0; k < max(h.Uplinks, 1); k++ {
		args = append(args, "--uplink", topology.UplinkName(k))
	}
	args = append(args,
		"--sliver-cgroups", HostCgroupDir(st, host),
		"--bpffs", st.BPFFS,
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", MetricsPort))
	if t.Datapath == topology.DatapathOnehop && t.Fabric.Controller != "" && slices.ContainsFunc(t.VMs, func(v topology.VM) bool { return v.VNAT }) {
		// VMs' VNAT daemons reach the controller's location server through
		// their host (internal/vnatrelay); a lab without VNAT VMs has no
		// relay, and its VMs reach no service on the host.
		args = append(args, "--location-server", t.Fabric.Controller)
	}
	return append(args, t.ARP.AgentArgs()...)
}

// vnatArgs are the arguments of a VNAT endpoint's daemon (issue 10), with
// its location server if the lab has one (docs/vnat-location.md) and the
// directory it pins in (on the lab's bpffs).
func vnatArgs(iface, locationServer, pinDir string) []string {
	args := []string{"vnat", "run", "--iface", iface}
	if pinDir != "" {
		args = append(args, "--pin-dir", pinDir)
	}
	if locationServer != "" {
		args = append(args, "--location-server", locationServer)
	}
	return args
}

// spawn starts a daemon of node inside namespace ns and records it in the
// state, so that status sees it and teardown stops it.
func (b *builder) spawn(name, node, ns string, args ...string) error {
	p := Process{Name: name, Node: node, Netns: ns, Args: args, Log: filepath.Join(b.st.Dir, fileSafe(name)+".log")}
	for _, s := range b.st.Slivers {
		if s.Name == node {
			p.Cgroup = SliverCgroupDir(b.st, s.Host, s.Name)
		}
	}
	if err := start(b.opts.Binary, &p); err != nil {
		return err
	}
	b.st.Processes = append(b.st.Processes, p)
	return b.st.save()
}

// start runs p inside its namespace as a daemon that outlives this command.
func start(binary string, p *Process) error {
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	argv := append([]string{"netns-exec", p.Netns, "--", binary}, p.Args...)
	cmd := exec.Command(binary, argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own: a Ctrl-C meant for `lab up` does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if p.Cgroup != "" {
		// Born in its sliver's cgroup (clone3 CLONE_INTO_CGROUP): not
		// one instruction of it runs outside the sliver's confinement.
		cg, err := os.Open(p.Cgroup)
		if err != nil {
			return fmt.Errorf("start %s: cgroup: %w", p.Name, err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.PID = cmd.Process.Pid
	go func() { // reap it if it dies while this command still runs, and say how
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exited with status 0")
		}
		exits.Store(p.PID, err)
	}()
	return nil
}

// exits holds how daemons started by this process ended, by pid.
var exits sync.Map

// checkProcesses fails fast when a daemon died, with the end of its log.
func (b *builder) checkProcesses() error {
	for _, p := range b.st.Processes {
		if !alive(p.PID) {
			how := "exited"
			if e, ok := exits.Load(p.PID); ok {
				how = fmt.Sprintf("exited (%v)", e)
			}
			return fmt.Errorf("%s %s during lab up; its log %s ends with:\n%s", p.Name, how, p.Log, tail(p.Log, 10))
		}
	}
	return nil
}

// Restart stops the lab daemon running on node (if it still runs) and starts
// it again with the same arguments, e.g. to show that an agent restart does
// not interrupt traffic.
func Restart(st *State, node string, binary string) (*Process, error) {
	if binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		binary = exe
	}
	for i := range st.Processes {
		p := &st.Processes[i]
		if p.Node != node {
			continue
		}
		if alive(p.PID) {
			if err := stop(p.PID); err != nil {
				return nil, err
			}
		}
		if err := start(binary, p); err != nil {
			return nil, err
		}
		return p, st.save()
	}
	return nil, fmt.Errorf("lab %q runs no daemon on %q (daemons run on hosts and the controller)", st.Name, node)
}

func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie or a reused pid is not our daemon.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
		return false
	}
	// Mid-execve the cmdline reads empty; otherwise it must be ours.
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return len(cmd) == 0 || strings.Contains(string(cmd), "onehop")
}

func stop(pid int) error {
	syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50; i++ {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 20; i++ {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pid %d still running after SIGKILL", pid)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// keepLogs copies the daemons' logs out of a lab that is about to be torn
// down after a failed up, so the reason survives; returns where, or "".
func keepLogs(st *State) string {
	if len(st.Processes) == 0 {
		return ""
	}
	dir, err := os.MkdirTemp("", "onehop-failed-"+st.Name+"-")
	if err != nil {
		return ""
	}
	for _, p := range st.Processes {
		if b, err := os.ReadFile(p.Log); err == nil {
			os.WriteFile(filepath.Join(dir, filepath.Base(p.Log)), b, 0o600)
		}
	}
	return dir
}
