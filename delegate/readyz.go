package delegate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/overlaynet/overlay/subnet"
)

// DefaultHealthAddr is where overlayd serves /readyz unless told otherwise
// (overlayd run --health-addr); STATUS asks it there.
const DefaultHealthAddr = subnet.DefaultHealthAddr

// readyzTimeout bounds STATUS's question to overlayd: the runtime calls
// STATUS every few seconds and must not hang on a stuck daemon.
const readyzTimeout = 2 * time.Second

// ErrDaemonNotReady marks an overlayd that does not answer, or answers
// /readyz with anything but 200.
var ErrDaemonNotReady = errors.New("overlayd not ready")

// checkHealthAddr validates healthAddr: empty (do not ask overlayd) or a
// loopback address and port, so STATUS never sends anything off the host.
func checkHealthAddr(s string) error {
	if s == "" {
		return nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
		return invalidf("healthAddr %q must be a loopback address and port as given to overlayd run --health-addr (default %s), or \"\" for STATUS not to ask overlayd", s, DefaultHealthAddr)
	}
	return nil
}

// DaemonReady asks overlayd's /readyz at addr with a bare HTTP/1.0 GET over
// loopback (net/http would add about a millisecond to every exec of the
// plugin). 200 is ready; anything else, or no answer within readyzTimeout,
// is ErrDaemonNotReady with the daemon's reasons.
func (e *ExecInvoker) DaemonReady(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, readyzTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: nothing answers on %s (%v)", ErrDaemonNotReady, addr, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if _, err := fmt.Fprintf(conn, "GET /readyz HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
		return fmt.Errorf("%w: ask %s: %v", ErrDaemonNotReady, addr, err)
	}
	return readyzAnswer(addr, conn)
}

// readyzAnswer reads an HTTP/1.x answer to GET /readyz: nil for status
// 200, else ErrDaemonNotReady with the status and the body's first lines.
func readyzAnswer(addr string, r io.Reader) error {
	br := bufio.NewReader(io.LimitReader(r, 8<<10))
	line, err := br.ReadString('\n')
	if err != nil && line == "" {
		return fmt.Errorf("%w: no answer from %s (%v)", ErrDaemonNotReady, addr, err)
	}
	proto, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	code, _, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(proto, "HTTP/1.") {
		return fmt.Errorf("%w: %s did not answer as overlayd's health endpoint does: %q", ErrDaemonNotReady, addr, line)
	}
	if code == "200" {
		return nil
	}
	for { // skip the headers
		h, err := br.ReadString('\n')
		if err != nil || strings.TrimSpace(h) == "" {
			break
		}
	}
	body, _ := io.ReadAll(io.LimitReader(br, 512))
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	reasons := strings.Join(lines, " ")
	return fmt.Errorf("%w: %s/readyz answered %s: %s", ErrDaemonNotReady, addr, code, reasons)
}

// Status answers the runtime's question "is this node's network ready for
// new pods?": yes when an ADD now would succeed and the pod would reach the
// overlay, i.e. subnet.env is there and valid, overlayd answers ready on its
// loopback health endpoint (healthAddr, unless set to ""), and the
// delegate's STATUS passes. The first two fail with code 50.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, err := loadConf(args)
	if err != nil {
		return err
	}
	env, err := readEnv(conf.SubnetFile)
	if err != nil {
		return cniError(types.ErrPluginNotAvailable, err,
			"overlay network not ready: subnet file %s is missing or unusable; start overlayd (it writes the file once it holds this host's lease)", conf.SubnetFile)
	}
	d, err := Render(conf, env)
	if err != nil {
		return cniError(types.ErrInvalidNetworkConfig, err, "cannot render the delegate configuration: fix the network config file")
	}
	ctx := context.Background()
	if conf.HealthAddr != "" {
		if err := p.invoker.DaemonReady(ctx, conf.HealthAddr); err != nil {
			return cniError(types.ErrPluginNotAvailable, err,
				"overlay network not ready: overlayd is not ready at %s (healthAddr); see overlayd status and its log", conf.HealthAddr)
		}
	}
	if err := p.invoker.Status(ctx, d.Type, d.Config, Runtime{Path: args.Path}); err != nil {
		return delegateError("STATUS", d.Type, err)
	}
	return nil
}
