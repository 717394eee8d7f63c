package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
)

// workerProc is one worker process.
type workerProc struct {
	cmd *exec.Cmd
	in  *bufio.Writer
	out *json.Decoder
	pin interface{ Close() error }
}

func startWorker(source string, eps []string, from, to int, proxied float64, dir string, gogc int) (*workerProc, error) {
	cmd := exec.Command(os.Args[0], append([]string{"-role", "worker", "-source", source, "-from", strconv.Itoa(from), "-to", strconv.Itoa(to),
		"-proxied-share", strconv.FormatFloat(proxied, 'f', -1, 64), "-dir", dir, "-gogc", strconv.Itoa(gogc), "--"}, eps...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &workerProc{cmd: cmd, in: bufio.NewWriter(in), out: json.NewDecoder(out), pin: in}, nil
}

func (w *workerProc) send(cmd string) error {
	if cmd != "" {
		if _, err := w.in.WriteString(cmd + "\n"); err != nil {
			return err
		}
		if err := w.in.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func (w *workerProc) recv(v any) error { return w.out.Decode(v) }

// all sends cmd to every worker and decodes each one's answer.
func all[T any](ws []*workerProc, cmd string) ([]T, error) {
	for _, w := range ws {
		if err := w.send(cmd); err != nil {
			return nil, err
		}
	}
	out := make([]T, len(ws))
	for i, w := range ws {
		if err := w.recv(&out[i]); err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
	}
	return out, nil
}

type statsReply struct {
	Hosts      int              `json:"hosts"`
	RPCs       map[string]int64 `json:"rpcs"`
	Heap       float64          `json:"heap"`
	RSS        float64          `json:"rss"`
	Relists    int              `json:"relists"`
	Periodic   int              `json:"periodic_relists"`
	RelistsMax int              `json:"relists_max"`
	Warnings   int64            `json:"warnings"`
	Refusals   int64            `json:"refusals"`
	Kinds      map[string]int   `json:"warning_kinds"`
}

type seenReply struct {
	Seen    []int64 `json:"seen"`
	Missing int     `json:"missing"`
}

type sum struct {
	rpcs                map[string]int64
	heap, rss           float64
	relists, relistsMax int
	periodic            int
	refusals            int64
	kinds               map[string]int
}

func stats(ws []*workerProc) (sum, error) {
	rs, err := all[statsReply](ws, "stats")
	s := sum{rpcs: map[string]int64{}, kinds: map[string]int{}}
	for _, r := range rs {
		for k, v := range r.RPCs {
			s.rpcs[k] += v
		}
		s.heap += r.Heap
		s.rss += r.RSS
		s.relists += r.Relists
		s.periodic += r.Periodic
		s.relistsMax = max(s.relistsMax, r.RelistsMax)
		s.refusals += r.Refusals
		for k, v := range r.Kinds {
			s.kinds[k] += v
		}
	}
	return s, err
}
