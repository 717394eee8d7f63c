// Command kube-echo is the Kubernetes lab's test image, one static binary:
//
//	kube-echo pause                 the pod sandbox's pause process: waits for SIGTERM
//	kube-echo serve [-http :8080] [-udp :8081]
//	                                answers every HTTP request and every UDP
//	                                datagram with {"client":"<source ip:port>","pod":"<hostname>"}:
//	                                the source address as this server sees it (a
//	                                datagram's answer also carries its payload, "data")
//	kube-echo get URL               a client: prints the body of GET URL
//
// It is built by the lab (test/kube) and never shipped.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// reply is what the server answers.
type reply struct {
	Client string `json:"client"`
	Pod    string `json:"pod"`
	Data   string `json:"data,omitempty"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube-echo pause | serve [-http ADDR] [-udp ADDR] | get URL")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pause":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ExitOnError)
		httpAddr := fs.String("http", ":8080", "HTTP listen address")
		udpAddr := fs.String("udp", ":8081", "UDP listen address (empty: none)")
		_ = fs.Parse(os.Args[2:])
		if err := serve(*httpAddr, *udpAddr); err != nil {
			log.Fatal(err)
		}
	case "get":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: kube-echo get URL")
			os.Exit(2)
		}
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(os.Args[2])
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
			log.Fatal(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "kube-echo: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

func serve(httpAddr, udpAddr string) error {
	host, _ := os.Hostname()
	answer := func(client, payload string) []byte {
		data, _ := json.Marshal(reply{Client: client, Pod: host, Data: payload})
		return append(data, '\n')
	}
	errs := make(chan error, 2)
	if udpAddr != "" {
		conn, err := net.ListenPacket("udp", udpAddr)
		if err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := conn.ReadFrom(buf)
				if err != nil {
					errs <- err
					return
				}
				_, _ = conn.WriteTo(answer(from.String(), string(buf[:n])), from)
			}
		}()
	}
	srv := &http.Server{
		Addr:              httpAddr,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(answer(r.RemoteAddr, ""))
		}),
	}
	go func() { errs <- srv.ListenAndServe() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		return nil
	case err := <-errs:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
