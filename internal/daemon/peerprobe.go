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
	d.prober = peerhealth.New(peerhealth.Config{
		Settings: d.cfg.PeerProbe,
		Families: fams,
		Open: func(fam backend.Family) (peerhealth.Pinger, error) {
			fp := d.plane(fam)
			src := ownSubnet(d.lease, fam).Masked().Addr()
			pg, kind, err := d.cfg.Kernel.Pinger(fam, src)
			if err == nil {
				set := d.prober.Settings()
				d.log.Info("probing peers", "family", fam.String(), "socket", kind, "from", src.String(), "device", fp.dev.Name, "sweep", set.Sweep.String(), "rate", set.Rate)
			}
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
