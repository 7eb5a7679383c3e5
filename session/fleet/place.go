package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/berthvm/berth/session"
)

// Request is a create to place. Opts has its defaults applied (CPUs,
// memory, disk, image): the spec stored is what the owner will create.
type Request struct {
	Opts session.CreateOptions
	// On pins the session to this host (create --on H).
	On string
	// Door, if set, is the front door placing it: a host that registered
	// no address (no --listen) is a candidate only when it is the door,
	// since no other host could forward to it.
	Door string
}

// Placement is where a session went.
type Placement struct {
	Host string
	// Epoch is the owner key's mod revision: the session's fencing token.
	Epoch int64
	// Tries is how many commit transactions it took (1 without
	// contention); it is set also with ErrExists (0: the name was seen
	// taken before any commit).
	Tries int
}

// maxTries bounds the retries of a placement whose host another front
// door changed between its read and its commit.
const maxTries = 100

// Place places a new session: see the package doc. It fails with
// ErrExists when the name is taken (by an earlier or a concurrent
// create), ErrNoSpace when no host has room, ErrNotFound or
// ErrInvalidState for a pinned host that is gone or draining.
func Place(ctx context.Context, cli *clientv3.Client, req Request) (Placement, error) {
	o := req.Opts
	if err := session.ValidateName(o.Name); err != nil {
		return Placement{}, err
	}
	if o.CPUs <= 0 || o.MemoryMiB <= 0 || o.DiskBytes < 0 {
		return Placement{}, fmt.Errorf("place %s: CPUs, memory and disk must be set (defaults applied) : %w", o.Name, session.ErrInvalid)
	}
	if req.On != "" {
		if err := ValidateHostID(req.On); err != nil {
			return Placement{}, err
		}
	}
	spec := mustJSON(o)
	for try := 1; ; try++ {
		ops := []clientv3.Op{clientv3.OpGet(ownerKey(o.Name))}
		if req.On != "" {
			ops = append(ops, clientv3.OpGet(seenKey(req.On), clientv3.WithCountOnly()))
		}
		v, extra, err := read(ctx, cli, false, ops...)
		if err != nil {
			return Placement{}, err
		}
		if kvs := extra[0].GetResponseRange().Kvs; len(kvs) > 0 {
			return Placement{Tries: try - 1}, exists(o.Name, kvs[0].Value)
		}
		if req.On != "" && extra[1].GetResponseRange().Count > 0 {
			v.seen[req.On] = HostRecord{ID: req.On} // remembered: gone, not unknown
		}
		host, err := v.pick(req)
		if err != nil {
			return Placement{}, err
		}
		l, at := v.live[host], v.alloc[host]
		a := at.a
		a.CPUs += o.CPUs
		a.MemoryMiB += int64(o.MemoryMiB)
		a.Sessions++
		r, err := cli.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(ownerKey(o.Name)), "=", 0),
			clientv3.Compare(clientv3.ModRevision(allocKey(host)), "=", at.rev),
			clientv3.Compare(clientv3.ModRevision(hostKey(host)), "=", l.rev),
		).Then(
			clientv3.OpPut(specKey(o.Name), spec),
			clientv3.OpPut(ownerKey(o.Name), mustJSON(Owner{Host: host})),
			clientv3.OpPut(allocKey(host), mustJSON(a)),
		).Else(clientv3.OpGet(ownerKey(o.Name))).Commit()
		if err != nil {
			return Placement{}, fmt.Errorf("place %s: commit to etcd: %w", o.Name, err)
		}
		if r.Succeeded {
			return Placement{Host: host, Epoch: r.Header.Revision, Tries: try}, nil
		}
		if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			return Placement{Tries: try}, exists(o.Name, kvs[0].Value)
		}
		if try >= maxTries {
			return Placement{}, fmt.Errorf("place %s: host %s kept changing under %d tries (heavy contention): try again: %w", o.Name, host, try, session.ErrConflict)
		}
		// Another front door placed on the same host first (or the host
		// rewrote its record: a refresh, a drain): read again,
		// after a short random pause so the colliders spread out.
		select {
		case <-ctx.Done():
			return Placement{}, ctx.Err()
		case <-time.After(rand.N(time.Duration(min(try, 10)) * time.Millisecond)):
		}
	}
}

func exists(name string, owner []byte) error {
	where := ""
	if o, err := ParseOwner(owner); err == nil {
		where = " on host " + o.Host
	}
	return &session.Error{Class: session.ErrExists, Msg: fmt.Sprintf("session %s already exists%s", name, where)}
}

// fits says why host cannot take o, or "".
func (v *view) fits(id string, o session.CreateOptions) string {
	l := v.live[id]
	a := v.alloc[id].a
	switch {
	case l.rec.Draining:
		return "it is draining"
	case a.CPUs+o.CPUs > l.rec.CPUs:
		return fmt.Sprintf("%d of its %d CPUs are promised, %d more asked", a.CPUs, l.rec.CPUs, o.CPUs)
	case a.MemoryMiB+int64(o.MemoryMiB) > l.rec.MemoryMiB:
		return fmt.Sprintf("%d of its %d MiB of memory are promised, %d more asked", a.MemoryMiB, l.rec.MemoryMiB, o.MemoryMiB)
	case l.rec.DiskFree-o.DiskBytes < l.rec.Floor:
		return fmt.Sprintf("%s free, a %s disk would go below its %s floor", session.FormatBytes(l.rec.DiskFree),
			session.FormatBytes(o.DiskBytes), session.FormatBytes(l.rec.Floor))
	}
	return ""
}

// unreachable says why the door cannot reach host id, or "".
func (v *view) unreachable(req Request, id string) string {
	if req.Door == "" || id == req.Door || v.live[id].rec.Addr != "" {
		return ""
	}
	return fmt.Sprintf("it serves no address for other hosts (its berth serve has no --listen), and the front door is %s", req.Door)
}

// pick chooses the host among those with room: those with the image
// first, then the less promised (the larger of its CPU and memory
// shares) of two drawn at random.
func (v *view) pick(req Request) (string, error) {
	o := req.Opts
	if req.On != "" {
		if _, ok := v.live[req.On]; !ok {
			if _, seen := v.seen[req.On]; seen {
				return "", &session.Error{Class: session.ErrInvalidState, Msg: fmt.Sprintf("host %s is gone (its lease expired or it left)", req.On)}
			}
			return "", &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("no host %s in the fleet", req.On), Hint: "berth host ls lists them"}
		}
		if why := v.unreachable(req, req.On); why != "" {
			return "", &session.Error{Class: session.ErrInvalidState, Msg: fmt.Sprintf("host %s cannot take %s: %s", req.On, o.Name, why)}
		}
		if why := v.fits(req.On, o); why != "" {
			class := session.ErrNoSpace
			if v.live[req.On].rec.Draining {
				class = session.ErrInvalidState
			}
			return "", &session.Error{Class: class, Msg: fmt.Sprintf("host %s cannot take %s: %s", req.On, o.Name, why)}
		}
		return req.On, nil
	}
	type cand struct {
		id    string
		image bool
		load  float64
	}
	var cs []cand
	for id, l := range v.live {
		if v.fits(id, o) != "" || v.unreachable(req, id) != "" {
			continue
		}
		a := v.alloc[id].a
		load := max(float64(a.CPUs+o.CPUs)/float64(l.rec.CPUs), float64(a.MemoryMiB+int64(o.MemoryMiB))/float64(l.rec.MemoryMiB))
		cs = append(cs, cand{id: id, image: o.Image != "" && slices.Contains(l.rec.Images, o.Image), load: load})
	}
	if len(cs) == 0 {
		return "", &session.Error{Class: session.ErrNoSpace, Msg: fmt.Sprintf("no host of the fleet has room for %s (%d CPUs, %d MiB, a %s disk above its floor; %d hosts live)",
			o.Name, o.CPUs, o.MemoryMiB, session.FormatBytes(o.DiskBytes), len(v.live))}
	}
	// Those with the image, if any has it; then the less promised of two
	// drawn at random (the power of two choices): near the least
	// promised, and front doors placing at once seldom pick the same host.
	if slices.ContainsFunc(cs, func(c cand) bool { return c.image }) {
		cs = slices.DeleteFunc(cs, func(c cand) bool { return !c.image })
	}
	a, b := cs[rand.N(len(cs))], cs[rand.N(len(cs))]
	if b.load < a.load || (b.load == a.load && b.id < a.id) {
		a = b
	}
	return a.id, nil
}

// Release forgets a session placed by Place: its keys go and its host's
// allocation shrinks, in one transaction guarded by the owner's epoch and
// the allocation's revision. A session not in the fleet is ErrNotFound.
func Release(ctx context.Context, cli *clientv3.Client, name string) error {
	return ReleaseAt(ctx, cli, name, 0)
}

// ReleaseAt is Release by the holder of epoch (0: any): an owner key at
// another epoch (the session moved, or was made again) is refused with
// CodeStaleEpoch and left alone.
func ReleaseAt(ctx context.Context, cli *clientv3.Client, name string, epoch int64) error {
	for try := 1; ; try++ {
		r, err := cli.Txn(ctx).Then(clientv3.OpGet(specKey(name)), clientv3.OpGet(ownerKey(name))).Commit()
		if err != nil {
			return fmt.Errorf("release %s: read etcd: %w", name, err)
		}
		skv, okv := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
		if len(okv) == 0 {
			return &session.Error{Class: session.ErrNotFound, Msg: fmt.Sprintf("no session %s in the fleet", name)}
		}
		owner, err := ParseOwner(okv[0].Value)
		if err != nil {
			return fmt.Errorf("release %s: %w", name, err)
		}
		if epoch != 0 && okv[0].ModRevision != epoch {
			return &session.Error{Class: session.ErrConflict, Code: session.CodeStaleEpoch,
				Msg: fmt.Sprintf("release %s at epoch %d: the owner is now at %d on host %s", name, epoch, okv[0].ModRevision, owner.Host)}
		}
		var spec session.CreateOptions
		if len(skv) > 0 {
			if err := decode(skv[0].Value, &spec); err != nil {
				return fmt.Errorf("release %s: spec: %w", name, err)
			}
		}
		ar, err := cli.Get(ctx, allocKey(owner.Host))
		if err != nil {
			return fmt.Errorf("release %s: read etcd: %w", name, err)
		}
		var a Alloc
		var arev int64
		if len(ar.Kvs) > 0 {
			if a, err = ParseAlloc(ar.Kvs[0].Value); err != nil {
				return fmt.Errorf("release %s: %w", name, err)
			}
			arev = ar.Kvs[0].ModRevision
		}
		a.CPUs = max(0, a.CPUs-spec.CPUs)
		a.MemoryMiB = max(0, a.MemoryMiB-int64(spec.MemoryMiB))
		a.Sessions = max(0, a.Sessions-1)
		tr, err := cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(ownerKey(name)), "=", okv[0].ModRevision),
			clientv3.Compare(clientv3.ModRevision(allocKey(owner.Host)), "=", arev),
		).Then(
			clientv3.OpDelete(sessionsDir+name+"/", clientv3.WithPrefix()),
			clientv3.OpPut(allocKey(owner.Host), mustJSON(a)),
		).Commit()
		if err != nil {
			return fmt.Errorf("release %s: commit to etcd: %w", name, err)
		}
		if tr.Succeeded {
			return nil
		}
		if try >= maxTries {
			return fmt.Errorf("release %s: kept colliding (%d tries): try again: %w", name, try, session.ErrConflict)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(rand.N(time.Duration(min(try, 10)) * time.Millisecond)):
		}
	}
}
