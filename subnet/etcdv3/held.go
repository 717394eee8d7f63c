package etcdv3

import (
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// held is this host's lease as the Manager holds it now: what readiness
// reads (Lease, Expires, KeyProblem), and what the acquirer and the keeper
// share (the etcd lease to reuse, the revision the key was last seen at).
type held struct {
	mu    sync.Mutex
	lease subnet.Lease
	// seen is a revision at which the lease key was known to hold lease;
	// the key's watch resumes after it. The key's own ModRevision will not
	// do: it is usually old, and once history is compacted past it a watch
	// from there fails at once, every time.
	seen      int64
	etcdLease clientv3.LeaseID
	expires   time.Time // when the etcd lease runs out unless renewed
	keyErr    error     // why the lease key is not known to be ours, while re-claiming
	created   bool      // Acquire created the lease key (Created)
}

// Lease returns the lease currently held.
func (m *held) Lease() subnet.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease
}

// Created reports whether Acquire created the lease key.
func (m *held) Created() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.created
}

func (m *held) markCreated() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.created = true
}

// Expires returns when the held lease expires unless renewed; zero for a
// reservation.
func (m *held) Expires() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.expires
}

// KeyProblem says why the lease key is not known to hold this host's lease.
func (m *held) KeyProblem() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keyErr
}

func (m *held) setKeyProblem(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keyErr = err
}

// etcdLeaseID is the etcd lease kept for reuse, 0 if none.
func (m *held) etcdLeaseID() clientv3.LeaseID {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcdLease
}

func (m *held) clearEtcdLease() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.etcdLease = 0
}

func (m *held) setEtcdLease(id clientv3.LeaseID, ttl time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.etcdLease = id
	m.expires = time.Now().Add(ttl)
}

// setSeen records that the lease key was as m.lease says at revision rev.
func (m *held) setSeen(rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = max(m.seen, rev)
}

// forgetEtcdLease drops id if it is the etcd lease kept for reuse.
func (m *held) forgetEtcdLease(id clientv3.LeaseID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcdLease == id {
		m.etcdLease = 0
	}
}

// forgetStore drops what refers to a store that was re-created: the
// revisions seen (the new store's are lower) and the etcd lease (gone
// with it).
func (m *held) forgetStore() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen, m.lease.ModRevision, m.etcdLease = 0, 0, 0
}

func (m *held) seenRev() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(m.seen, m.lease.ModRevision)
}

func (m *held) setLease(l subnet.Lease) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lease = l
	if l.Reserved {
		m.expires = time.Time{}
	}
}
