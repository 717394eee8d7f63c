package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cluster is three etcd member processes.
type cluster struct {
	dir   string
	ports []int
	procs []*exec.Cmd
	eps   []string
}

func startCluster() (*cluster, error) {
	dir, err := os.MkdirTemp("/tmp", "scale")
	if err != nil {
		return nil, err
	}
	cl := &cluster{dir: dir, procs: make([]*exec.Cmd, 3)}
	if cl.ports, err = etcdtest.FreePorts(3); err != nil {
		return nil, err
	}
	for i := range 3 {
		cl.eps = append(cl.eps, "unix://"+filepath.Join(dir, memberName(i)+".sock"))
	}
	errs := make(chan error, 3)
	for i := range 3 {
		go func() { errs <- cl.start(i, "new") }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			cl.close()
			return nil, err
		}
	}
	return cl, nil
}

func (cl *cluster) start(i int, state string) error {
	var ps []string
	for _, p := range cl.ports {
		ps = append(ps, strconv.Itoa(p))
	}
	cmd := exec.Command(os.Args[0], "-role", "member", "-dir", cl.dir, "-i", strconv.Itoa(i), "-ports", strings.Join(ps, ","), "-state", state)
	// Members log to a file: a stopped member's shutdown is noisy.
	logf, err := os.OpenFile(filepath.Join(cl.dir, memberName(i)+".log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	cl.procs[i] = cmd
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("etcd member %d did not start: %v", i, err)
	}
	return nil
}

func (cl *cluster) stop(i int) {
	if p := cl.procs[i]; p != nil {
		_ = p.Process.Signal(syscall.SIGTERM)
		_ = p.Wait()
		cl.procs[i] = nil
	}
}

func (cl *cluster) close() {
	for i := range cl.procs {
		cl.stop(i)
	}
	_ = os.RemoveAll(cl.dir)
}

// usage returns each running member's CPU seconds (by PID) and RSS.
func (cl *cluster) usage() (cpu map[int]float64, rss []int64) {
	cpu = map[int]float64{}
	for _, p := range cl.procs {
		if p != nil {
			cpu[p.Process.Pid] = procCPU(p.Process.Pid)
			rss = append(rss, procRSS(p.Process.Pid))
		}
	}
	return cpu, rss
}

// cpuSince is the CPU the members running at both samples used between
// them (a member stopped in between is left out), in cores.
func cpuSince(a, b map[int]float64, secs float64) float64 {
	var d float64
	for pid, v := range b {
		if u, ok := a[pid]; ok {
			d += v - u
		}
	}
	return d / secs
}

// leader returns the index of the member that leads.
func (cl *cluster) leader(cli *clientv3.Client) int {
	for i, ep := range cl.eps {
		if cl.procs[i] == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.Status(ctx, ep)
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}
