package main

import (
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runMember runs etcd member i of a cluster whose members listen for
// clients on unix sockets in dir and for peers on loopback ports. It runs in
// a process of its own so its CPU and memory can be read from /proc and it
// can be stopped by PID like a real member.
func runMember(dir string, i int, ports []int, state string) error {
	cfg := embed.NewConfig()
	cfg.Name = memberName(i)
	cfg.Dir = filepath.Join(dir, cfg.Name)
	cfg.Logger, cfg.LogLevel, cfg.LogOutputs = "zap", "error", []string{"stderr"}
	cfg.UnsafeNoFsync = true
	cu := url.URL{Scheme: "unix", Path: filepath.Join(dir, cfg.Name+".sock")}
	pu := peerURL(ports[i])
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	var peers []string
	for j, p := range ports {
		u := peerURL(p)
		peers = append(peers, memberName(j)+"="+u.String())
	}
	cfg.InitialCluster, cfg.ClusterState = strings.Join(peers, ","), state
	// Thousands of clients: etcd's default per-connection stream limit is
	// plenty, but the request queue must not be the limit being measured.
	cfg.MaxTxnOps = 1024
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return fmt.Errorf("member %s not ready after 60s", cfg.Name)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		return err
	}
	return nil
}

func memberName(i int) string { return "m" + strconv.Itoa(i) }

func peerURL(port int) url.URL {
	return url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)}
}
