package daemon

import (
	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/peerhealth"
)

// newProber makes the prober of the peers' health (unless
// Config.NoPeerProbe): it is handed the peer set with the planes
// (publishPeers) and runs beside them. It probes from this host's VTEP
// address of each family, along the routes the planes program, and holds its
// probes until every plane's first pass is over: at a cold start the
// kernel writes of thousands of peers come first, and a peer probed
// before its route exists would count as lost.
func (d *daemon) newProber() {
	if d.cfg.NoPeerProbe {
		return
	}
	var fams []backend.Family
	for _, fp := range d.planes {
		fams = append(fams, fp.family)
	}
	// Open is called by the prober's Run alone: at its start, and again
	// when a socket breaks (logged at Debug, as the prober warns).
	var opened [2]bool
	d.prober = peerhealth.New(peerhealth.Config{
		Settings: d.cfg.PeerProbe,
		Families: fams,
		Open: func(fam backend.Family) (peerhealth.Pinger, error) {
			src := ownSubnet(d.lease, fam).Masked().Addr()
			pg, kind, err := d.cfg.Kernel.Pinger(fam, src)
			if err != nil {
				return nil, err
			}
			i := 0
			if fam == backend.IPv6 {
				i = 1
			}
			if opened[i] {
				d.log.Debug("reopened the probe socket", "family", fam.String(), "socket", kind, "from", src.String())
				return pg, nil
			}
			opened[i] = true
			set := d.prober.Settings()
			d.log.Info("probing peers from this host's VTEP address", "family", fam.String(), "socket", kind, "from", src.String(), "sweep", set.Sweep.String(), "rate", set.Rate)
			return pg, err
		},
		Hold: func() bool {
			for _, fp := range d.planes {
				if fp.plane.Status().LastPass.IsZero() {
					return true
				}
			}
			return false
		},
		OnResult: d.m.probed,
		Logger:   d.log,
	})
	d.st.set(func(p *probe) { p.health = d.prober })
}
