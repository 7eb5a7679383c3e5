// Package fleet is berth across hosts on etcd: a host's registration
// under a lease (Join), the fleet's hosts as `berth host ls` shows them
// (List), the placement of a new session by one transaction (Place),
// every host's front door (Router), a session.Service that serves each
// session from its owner, forwarding over the API at the session's
// epoch, the fence that keeps an isolated host from changing anything
// (Fence), the quarantine of stale copies at rejoin (QuarantineStale),
// checkpoint replicas and the recovery of a gone host's session from one
// (Router.ReplicateCheckpoint, Router.Recover),
// and an ordered, resumable watch of the fleet's keys (Watcher). The
// daemon uses it through Node, Fence and Router; it imports no engine
// (the Router is given the host's own Service).
//
// # Isolation
//
// A host judges its lease by its own monotonic clock: live until the
// send time of the last renewal etcd confirmed plus the TTL minus a
// margin, so it knows itself isolated before etcd can expire the lease
// and another host see it gone. Isolated (or rejoining), it refuses
// every change (session.ErrIsolated) while its VMs and running commands
// go on; when etcd answers again it registers under a new lease, sets
// aside every local copy whose owner key names another host or a later
// epoch, and only then takes changes again.
//
// # Keys
//
// Every key is under Prefix, "/berth/v1/"; values are JSON of at most
// MaxRecord bytes, read back through the parsers in records.go (every
// peer is untrusted, etcd's contents included). Names are short because
// every placement reads them all.
//
//	hosts/H            HostRecord  under H's lease: present while H is alive
//	seen/H             Seen        no lease: H's last registration, so a host whose
//	                               lease expired is remembered as gone, and H
//	                               restarted reads its draining flag back
//	alloc/H            Alloc       no lease: what placement promised H (CPUs, memory,
//	                               sessions); its mod revision guards placement
//	sessions/S/spec    Spec        S's create options, desired state (a Session CRD's .spec)
//	sessions/S/owner   Owner       the host that holds S; its mod revision is S's epoch,
//	                               which every call a front door forwards carries
//	sessions/S/status  Status      the owner's last lifecycle change of S and the
//	                               state it left, written only by a transaction at
//	                               the current epoch (a CRD's .status); each change
//	                               the owner makes commits it first (router_status.go)
//	sessions/S/replicas/H/ID
//	                   ReplicaRecord  no lease: host H keeps a copy of checkpoint ID of S
//
// alloc/H is not under hosts/H/ so that a prefix read of hosts/ yields
// host records only. A session's keys are together under sessions/S/ so
// that one prefix read or delete takes the whole session, as a CRD
// object holds .spec and .status together.
//
// A replica's key has no lease on purpose: it must outlive the owner
// (whose loss is what it is for) and H's own restarts; H's copy is on
// disk whether H is up or not, and a recovery needs H live anyway. It is
// written by the owner at its epoch (a session moved or recovered since
// is not said to have it) and goes with S's keys when S is deleted, when
// the deleting front door asks each H to drop its copy.
//
// # Recovery
//
// A host that is gone is judged by etcd alone: its hosts/H key, under
// its lease, is absent once etcd has expired the lease, whatever any
// host's clock says. Recover makes H2 the owner of a session of a gone
// host in one transaction guarded by the owner key's mod revision read
// (so of two recoveries, or a recovery and any other change, one wins),
// hosts/OLD being absent, H2's replica record unchanged and hosts/H2
// the registration read; the session's allocation moves to H2. The old
// host's copy is then behind the owner key: at its rejoin it is
// quarantined (QuarantineStale) before the host takes a change.
//
// # Placement
//
// Place reads hosts/, alloc/ and S's owner at one revision, picks a live,
// non-draining host with room (CPUs and memory against what alloc/H has
// promised; free disk above the host's floor), preferring hosts that
// have the image, then the least promised, and commits spec, owner and
// alloc/H in one transaction guarded by S's owner being absent, alloc/H's
// mod revision being the one read, and hosts/H still being the
// registration read (its mod revision: so a placement that read H before
// a drain marked it cannot land after). A guard that fails on the owner
// is ErrExists; on the host (another placement, a refresh of its record,
// a drain), the read is retried. So concurrent creates of one name from
// many front doors make it once, and no host is promised more than it
// has. A move's commit (Transfer) is guarded the same way.
package fleet

import "strings"

// Prefix is where every key of a fleet lives.
const Prefix = "/berth/v1/"

// MaxRecord bounds a value read back from etcd.
const MaxRecord = 64 << 10

// MaxHosts bounds the hosts one read returns.
const MaxHosts = 10000

const (
	hostsDir    = Prefix + "hosts/"
	seenDir     = Prefix + "seen/"
	allocDir    = Prefix + "alloc/"
	sessionsDir = Prefix + "sessions/"
)

func hostKey(h string) string  { return hostsDir + h }
func seenKey(h string) string  { return seenDir + h }
func allocKey(h string) string { return allocDir + h }
func specKey(s string) string  { return sessionsDir + s + "/spec" }
func ownerKey(s string) string { return sessionsDir + s + "/owner" }

// idOf is the last segment of a key under dir.
func idOf(dir, key string) string { return strings.TrimPrefix(key, dir) }
