package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// cluster is an external etcd cluster of member processes on loopback
// (Debian's etcd-server), for the harness's "external store" run.
type cluster struct {
	members []*member
}

type member struct {
	name, client string
	cmd          *exec.Cmd
	exited       chan error
}

// startCluster starts n etcd members under dir and waits until every one
// answers.
func startCluster(ctx context.Context, binary, dir string, n int) (*cluster, error) {
	c := &cluster{}
	var peers []string
	type urls struct{ client, peer string }
	var us []urls
	for i := 0; i < n; i++ {
		cp, err := freePort()
		if err != nil {
			return nil, err
		}
		pp, err := freePort()
		if err != nil {
			return nil, err
		}
		u := urls{fmt.Sprintf("http://127.0.0.1:%d", cp), fmt.Sprintf("http://127.0.0.1:%d", pp)}
		us = append(us, u)
		peers = append(peers, fmt.Sprintf("m%d=%s", i, u.peer))
	}
	for i, u := range us {
		name := fmt.Sprintf("m%d", i)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			c.stop()
			return nil, err
		}
		cmd := exec.Command(binary, "--name", name, "--data-dir", filepath.Join(dir, name),
			"--listen-client-urls", u.client, "--advertise-client-urls", u.client,
			"--listen-peer-urls", u.peer, "--initial-advertise-peer-urls", u.peer,
			"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "onehop-scale", "--quota-backend-bytes", fmt.Sprint(2<<30))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			c.stop()
			return nil, fmt.Errorf("start etcd member %s: %w", name, err)
		}
		m := &member{name: name, client: u.client, cmd: cmd, exited: make(chan error, 1)}
		go func() { m.exited <- cmd.Wait(); logf.Close() }()
		c.members = append(c.members, m)
	}
	cli, err := dial(c.endpoints())
	if err != nil {
		c.stop()
		return nil, err
	}
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range c.members {
		for {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := cli.Status(sctx, m.client)
			cancel()
			if err == nil {
				break
			}
			select {
			case err := <-m.exited:
				c.stop()
				return nil, fmt.Errorf("etcd member %s exited at start (%v); see %s", m.name, err, filepath.Join(dir, m.name+".log"))
			default:
			}
			if time.Now().After(deadline) {
				c.stop()
				return nil, fmt.Errorf("etcd member %s not ready after 30s: %w", m.name, err)
			}
			time.Sleep(100 * time.Millisecond) // poll interval while the member starts
		}
	}
	return c, nil
}

func (c *cluster) endpoints() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.client)
	}
	return out
}

// killLeader kills the member that leads the cluster now (SIGKILL: no
// goodbye to its peers) and returns its name.
func (c *cluster) killLeader(ctx context.Context) (string, error) {
	cli, err := dial(c.endpoints())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	for _, m := range c.members {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, m.client)
		cancel()
		if err != nil || st.Leader != st.Header.MemberId {
			continue
		}
		if err := m.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			return "", fmt.Errorf("kill etcd member %s: %w", m.name, err)
		}
		<-m.exited
		m.exited <- errors.New("killed")
		return m.name, nil
	}
	return "", errors.New("no etcd member says it leads")
}

// stop ends every member still running.
func (c *cluster) stop() {
	for _, m := range c.members {
		select {
		case err := <-m.exited:
			m.exited <- err
			continue
		default:
		}
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(10 * time.Second):
			m.cmd.Process.Kill()
			<-m.exited
		}
	}
}

func dial(endpoints []string) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", endpoints, err)
	}
	return c, nil
}

// freePort is a loopback TCP port nobody listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
