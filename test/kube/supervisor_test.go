package kubee2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// A node's processes (containerd, kubelet, kube-proxy and everything they
// start: shims, runc, the pods) must share one mount namespace of their
// own, with a tmpfs on /run and the node's own directories over
// /var/lib/cni, /var/log, /etc/cni and /opt/cni, so that nothing of the
// root namespace's is touched. A Go program cannot move itself into
// another mount namespace (setns refuses a multithreaded caller), so each
// node has a supervisor: this test binary run again with supervisorEnv
// set, born in the node's network namespace and in a new mount namespace
// (CLONE_NEWNS, which also makes every mount private: nothing propagates
// back). It makes the mounts, then starts the programs the test asks for
// over its standard input and reports their PIDs and exits on its
// standard output, one JSON object a line.
//
// It is a child subreaper, so the shims and containers that daemonise
// become its children when their parents die; when the test says stop,
// when its standard input closes or when the test process dies
// (PR_SET_PDEATHSIG, SIGTERM), it stops the programs it started by PID
// (SIGTERM, then SIGKILL) and then kills every child left, until it has
// none: nothing the node started outlives it.
const supervisorEnv = "KUBELAB_SUPERVISOR"

// mount is one mount the supervisor makes, in order: a tmpfs (Source
// empty) or a bind of Source (a directory or a file) onto Target.
type mount struct {
	Source string `json:"source,omitempty"`
	Target string `json:"target"`
}

// request is one line the test writes to a supervisor.
type request struct {
	Op   string   `json:"op"` // start, stop
	Name string   `json:"name,omitempty"`
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Log  string   `json:"log,omitempty"`
	Dir  string   `json:"dir,omitempty"`
}

// event is one line a supervisor writes.
type event struct {
	Op     string `json:"op"` // ready, started, exited, error, stopped
	Name   string `json:"name,omitempty"`
	PID    int    `json:"pid,omitempty"`
	Status string `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

// runSupervisor is the supervisor's main; mounts come as JSON in
// supervisorEnv. It never returns.
func runSupervisor() {
	// The test may be gone (killed) while this stops the node: a write
	// to its pipe must fail, not kill this process half-way (SIGPIPE).
	signal.Ignore(syscall.SIGPIPE)
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	emit := func(e event) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(e)
	}
	fail := func(err error) {
		emit(event{Op: "error", Error: err.Error()})
		os.Exit(1)
	}
	var mounts []mount
	if err := json.Unmarshal([]byte(os.Getenv(supervisorEnv)), &mounts); err != nil {
		fail(fmt.Errorf("supervisor: mounts: %w", err))
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fail(fmt.Errorf("supervisor: become a subreaper: %w", err))
	}
	for _, m := range mounts {
		var err error
		if m.Source == "" {
			err = unix.Mount("tmpfs", m.Target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755")
		} else {
			err = unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, "")
		}
		if err != nil {
			fail(fmt.Errorf("supervisor: mount %q on %s: %w", m.Source, m.Target, err))
		}
	}
	// What the node's programs expect under the new /run.
	for _, d := range []string{"/run/lock", "/run/netns"} {
		_ = os.MkdirAll(d, 0o755)
	}

	s := &supervisor{emit: emit, names: map[int]string{}}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	stop := make(chan struct{}, 1)
	go func() {
		for sig := range signals {
			if sig == syscall.SIGCHLD {
				s.reap()
				continue
			}
			select {
			case stop <- struct{}{}:
			default:
			}
		}
	}()
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64*1024), 4<<20)
		for sc.Scan() {
			var r request
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				emit(event{Op: "error", Error: fmt.Sprintf("bad request %q: %v", sc.Text(), err)})
				continue
			}
			switch r.Op {
			case "start":
				pid, err := s.start(r)
				if err != nil {
					emit(event{Op: "error", Name: r.Name, Error: err.Error()})
				} else {
					emit(event{Op: "started", Name: r.Name, PID: pid})
				}
			case "stop":
				stop <- struct{}{}
				return
			}
		}
		// The test closed our input or died.
		select {
		case stop <- struct{}{}:
		default:
		}
	}()
	emit(event{Op: "ready", PID: os.Getpid()})
	<-stop
	s.stopAll()
	emit(event{Op: "stopped"})
	os.Exit(0)
}

type supervisor struct {
	emit  func(event)
	mu    sync.Mutex
	order []int          // started programs, in order
	names map[int]string // started programs by PID
}

func (s *supervisor) start(r request) (int, error) {
	if len(r.Argv) == 0 {
		return 0, errors.New("empty argv")
	}
	logf, err := os.OpenFile(r.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	bin, err := exec.LookPath(r.Argv[0])
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, err := syscall.ForkExec(bin, r.Argv, &syscall.ProcAttr{
		Dir:   r.Dir,
		Env:   r.Env,
		Files: []uintptr{devnull.Fd(), logf.Fd(), logf.Fd()},
		// Its own process group (a signal to the test's group does not
		// reach it); killed if the supervisor dies.
		Sys: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", r.Argv[0], err)
	}
	s.order = append(s.order, pid)
	s.names[pid] = r.Name
	return pid, nil
}

// reap collects every child that exited; those the test started are
// reported.
func (s *supervisor) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		s.mu.Lock()
		name, ok := s.names[pid]
		delete(s.names, pid)
		s.mu.Unlock()
		if ok {
			s.emit(event{Op: "exited", Name: name, PID: pid, Status: waitStatus(ws)})
		}
	}
}

func waitStatus(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(ws.ExitStatus())
}

// stopAll stops the started programs in the reverse order of their start
// (SIGTERM, up to 20 s each, then SIGKILL), then kills the children left
// (shims, containers: adopted as the subreaper) until there are none.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	order := append([]int(nil), s.order...)
	s.mu.Unlock()
	for i := len(order) - 1; i >= 0; i-- {
		pid := order[i]
		if !s.running(pid) {
			continue
		}
		_ = unix.Kill(pid, unix.SIGTERM)
		deadline := time.Now().Add(20 * time.Second)
		for s.running(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			s.reap()
		}
		if s.running(pid) {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	for range 600 {
		s.reap()
		kids := children(os.Getpid())
		if len(kids) == 0 {
			return
		}
		for _, pid := range kids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *supervisor) running(pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.names[pid]
	return ok
}

// children lists the PIDs whose parent is pid (from /proc).
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid(p) == pid {
			out = append(out, p)
		}
	}
	return out
}

func ppid(pid int) int {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// nodeSupervisor is the test's side of a supervisor.
type nodeSupervisor struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	PID   int
	mu    sync.Mutex
	reply chan event
	procs map[string]*proc
	done  chan struct{}
	log   *os.File
}

// proc is a program a supervisor started.
type proc struct {
	Name   string
	PID    int
	Log    string
	exited chan struct{}
	status string
}

// Exited reports whether the program has exited, and how.
func (p *proc) Exited() (bool, string) {
	select {
	case <-p.exited:
		return true, p.status
	default:
		return false, ""
	}
}

// startSupervisor starts a supervisor in network namespace ns with mounts;
// its own messages go to logFile.
func startSupervisor(name string, ns netns.NsHandle, mounts []mount, logFile string) (*nodeSupervisor, error) {
	data, err := json.Marshal(mounts)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	lf, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	n := &nodeSupervisor{name: name, reply: make(chan event, 1), procs: map[string]*proc{}, done: make(chan struct{}), log: lf}
	n.cmd = exec.Command(self)
	n.cmd.Env = testenv.ProgramEnv(supervisorEnv + "=" + string(data))
	n.cmd.Stderr = lf
	n.cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS,
		Setpgid:      true,
		// SIGTERM, not SIGKILL: the supervisor stops its node when the
		// test process dies.
		Pdeathsig: syscall.SIGTERM,
	}
	if n.in, err = n.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := n.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := lab.Do(ns, n.cmd.Start); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start the supervisor of %s: %w", name, err)
	}
	n.PID = n.cmd.Process.Pid
	go n.read(stdout)
	select {
	case e := <-n.reply:
		if e.Op != "ready" {
			n.wait()
			return nil, fmt.Errorf("supervisor of %s: %s", name, e.Error)
		}
	case <-n.done:
		return nil, fmt.Errorf("supervisor of %s exited at start; see %s", name, logFile)
	case <-time.After(testenv.Deadline(30 * time.Second)):
		_ = n.cmd.Process.Kill()
		n.wait()
		return nil, fmt.Errorf("supervisor of %s: no answer; see %s", name, logFile)
	}
	return n, nil
}

func (n *nodeSupervisor) read(stdout io.Reader) {
	defer close(n.done)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintf(n.log, "supervisor said %q\n", sc.Text())
			continue
		}
		if e.Op == "exited" {
			n.mu.Lock()
			for _, p := range n.procs {
				if p.PID == e.PID {
					p.status = e.Status
					close(p.exited)
				}
			}
			n.mu.Unlock()
			fmt.Fprintf(n.log, "%s (pid %d) exited: %s\n", e.Name, e.PID, e.Status)
			continue
		}
		if e.Op == "stopped" {
			continue
		}
		n.reply <- e
	}
}

// Path is path as the node's programs see it, reached from the test's
// mount namespace (through the supervisor's root).
func (n *nodeSupervisor) Path(path string) string {
	return filepath.Join("/proc", strconv.Itoa(n.PID), "root", path)
}

// Start starts a program on the node; its output goes to logFile.
func (n *nodeSupervisor) Start(name, logFile string, env []string, argv ...string) (*proc, error) {
	data, err := json.Marshal(request{Op: "start", Name: name, Argv: argv, Env: env, Log: logFile})
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, err := n.in.Write(append(data, '\n')); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", n.name, name, err)
	}
	select {
	case e := <-n.reply:
		if e.Op != "started" {
			return nil, fmt.Errorf("%s: start %s: %s", n.name, name, e.Error)
		}
		p := &proc{Name: name, PID: e.PID, Log: logFile, exited: make(chan struct{})}
		n.procs[name] = p
		return p, nil
	case <-n.done:
		return nil, fmt.Errorf("%s: start %s: the supervisor exited", n.name, name)
	}
}

// StopProc stops one program by its PID: SIGTERM, then SIGKILL after
// grace.
func (n *nodeSupervisor) StopProc(p *proc, grace time.Duration) error {
	if done, _ := p.Exited(); done {
		return nil
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
	select {
	case <-p.exited:
		return fmt.Errorf("%s on %s did not stop on SIGTERM within %s; killed", p.Name, n.name, grace)
	case <-time.After(testenv.Deadline(30 * time.Second)):
		return fmt.Errorf("%s on %s (pid %d) survived SIGKILL", p.Name, n.name, p.PID)
	}
}

// Stop asks the supervisor to stop everything of the node and waits for it
// to exit. Safe to call twice.
func (n *nodeSupervisor) Stop() error {
	n.mu.Lock()
	if n.in != nil {
		_, _ = n.in.Write([]byte(`{"op":"stop"}` + "\n"))
		n.in.Close()
		n.in = nil
	}
	n.mu.Unlock()
	select {
	case <-n.done:
	case <-time.After(testenv.Deadline(2 * time.Minute)):
		_ = n.cmd.Process.Kill()
	}
	return n.wait()
}

func (n *nodeSupervisor) wait() error {
	<-n.done
	err := n.cmd.Wait()
	n.log.Close()
	return err
}
