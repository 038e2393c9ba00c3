package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/fanin-ml/fanin/internal/rto"
	"github.com/fanin-ml/fanin/wire"
)

// A worker of a direct-gradients job (spec gradients: direct) sends each shard's gradient as a
// core NATS request to the runtime that serves the shard, whose reply is a receipt, and nothing
// stores it: the worker keeps it (one copy per step, or the 16-bit encoding it makes anyway) until
// it holds the next step's parameters, and sends it again on a gap (docs/PROTOCOL.md, "Direct
// gradients"):
//
//   - no receipt in time: receiptTimeout, or longer while receipts come late (a timer that
//     follows the receipts' round trips, internal/rto), doubling while none comes, up to
//     maxReceiptTimeout;
//   - "no responders": no runtime serves the shard at this instant (a migration, a restart): again
//     after a backoff of 10 ms doubling to 0.5 s, until the Step's context ends;
//   - a resend notice of the shard's new owner (wire.ResendSubject): every kept step from the one
//     it names;
//   - a reconnect, or no parameters of a shard for twice the fallback's wait (the notice may have
//     been lost): every kept step of the shards still missing.
//
// A runtime answers a re-send of a gradient it holds or applied with a receipt and ignores it.
// At most directWindow bytes of requests are unanswered at a time: the runtime's connection is
// not flooded beyond what the server lets it queue (a slow consumer would be cut).
type directSender struct {
	w     *Worker
	inbox string // receipts come to inbox.<step>.<rank index>.<shard index>
	rsub  *nats.Subscription
	nsub  *nats.Subscription // resend notices
	wake  chan struct{}      // signalled by receipts and notices: the pump looks again
	// rto is how long a receipt may take, from the receipts that came: one timer for every
	// runtime the worker sends to, so a slow one lengthens the wait for the others' too.
	rto *rto.Estimator

	mu     sync.Mutex // guards everything below
	kept   [2]keptStep
	inFly  int           // bytes sent and neither answered nor given up
	resend map[int]int64 // per shard index: a notice's step, not yet applied to kept
	// sends counts every gradient request sent, first sends and re-sends; resends the re-sends by
	// cause: what a test and a benchmark check.
	sends   int64
	resends Resends
}

// Resends counts a direct-gradients worker's gradient requests sent again, by what made it send.
type Resends struct {
	Notice       int64 // a resend notice of a shard's new owner asked for them
	Stall        int64 // a shard's parameters were overdue, or the connection reconnected
	Timeout      int64 // no receipt came in time
	NoResponders int64 // no runtime served the shard when sent before
}

// Total is the number of re-sends, whatever their cause.
func (r Resends) Total() int64 { return r.Notice + r.Stall + r.Timeout + r.NoResponders }

func (r *Resends) count(why sendCause) {
	switch why {
	case sendNotice:
		r.Notice++
	case sendStall:
		r.Stall++
	case sendTimeout:
		r.Timeout++
	case sendNoResponders:
		r.NoResponders++
	}
}

// keptStep is one step's gradients of every rank of the worker, kept until the next step's
// parameters arrive, with the state of each (rank, shard) request.
type keptStep struct {
	step int64 // 0: empty
	data []byte
	reqs []directReq // rank index j, shard index i at j*shards+i
}

type directReq struct {
	msg     *nats.Msg
	state   reqState
	at      time.Time     // sent at, or (noResponders) when to send again
	timeout time.Duration // for a receipt of the next send
	backoff time.Duration // after the next "no responders"
	why     sendCause     // why it is due: what its next send is counted as, once sent before
	sent    bool          // sent at least once
	resent  bool          // sent more than once: its receipt is no round trip to learn from
}

type sendCause uint8

const (
	sendNotice sendCause = iota
	sendStall
	sendTimeout
	sendNoResponders
)

type reqState uint8

const (
	reqDue          reqState = iota // to send
	reqSent                         // sent, no answer yet
	reqReceipted                    // the runtime holds it, or applied it
	reqNoResponders                 // no runtime subscribed: send again at .at
)

// Timings of the direct sender.
const (
	receiptTimeout    = 5 * time.Second
	maxReceiptTimeout = 30 * time.Second
	noRespBackoff     = 10 * time.Millisecond
	maxNoRespBackoff  = 500 * time.Millisecond
	directPoll        = 50 * time.Millisecond
	directWindow      = 32 << 20
)

func newDirectSender(w *Worker) (*directSender, error) {
	d := &directSender{w: w, inbox: wire.InboxPrefix(w.rec.Spec.ID) + "." + nuid.Next(), wake: make(chan struct{}, 1), resend: map[int]int64{},
		rto: rto.New(receiptTimeout, maxReceiptTimeout)}
	var err error
	if d.rsub, err = w.c.nc.Subscribe(d.inbox+".>", d.onAnswer); err != nil {
		return nil, err
	}
	_ = d.rsub.SetPendingLimits(-1, -1) // answers are small; none may be dropped
	if d.nsub, err = w.c.nc.Subscribe(wire.ResendWildcard(w.rec.Spec.ID), d.onNotice); err != nil {
		_ = d.rsub.Unsubscribe()
		return nil, err
	}
	return d, nil
}

func (d *directSender) close() error {
	return errors.Join(d.rsub.Unsubscribe(), d.nsub.Unsubscribe())
}

func (d *directSender) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// keep copies (f32) or encodes (16-bit) step t's gradients into the slot of t, which held step
// t-2's: every request of it is due. Step t-1's stay kept until step t's parameters are in.
func (d *directSender) keep(t int64, grads [][]float32) {
	w := d.w
	es := w.dtype.ElemSize()
	n, elems := w.rec.Layout.NumShards(), w.rec.Layout.Elements
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.kept[t%2] // step t-2's, no longer needed (the worker holds step t-1's parameters), or t's again (a retried Step)
	d.release(k)
	if len(k.data) != es*elems*len(w.ranks) {
		k.data = make([]byte, es*elems*len(w.ranks))
		k.reqs = make([]directReq, len(w.ranks)*n)
	}
	k.step = t
	for j, g := range grads {
		wire.Encode(k.data[es*j*elems:es*(j+1)*elems], g, w.dtype)
		for i, s := range w.rec.Layout.Shards {
			r := &k.reqs[j*n+i]
			if r.msg == nil {
				r.msg = nats.NewMsg(wire.GradSubject(w.rec.Spec.ID, s.ID))
			}
			wire.SetGradHeaders(r.msg.Header, wire.Grad{Job: w.rec.Spec.ID, Shard: s.ID, Step: t, Rank: w.ranks[j], Dtype: w.dtype,
				Weight: w.weight, Attempt: w.attempt})
			r.msg.Data = k.data[es*(j*elems+s.Off) : es*(j*elems+s.Off+s.Len)]
			r.msg.Reply = d.inbox + "." + strconv.FormatInt(t, 10) + "." + strconv.Itoa(j) + "." + strconv.Itoa(i)
			*r = directReq{msg: r.msg, state: reqDue, timeout: receiptTimeout, backoff: noRespBackoff}
		}
	}
	d.applyNoticesLocked()
}

// release gives back the window of a slot's requests still in flight. d.mu is held.
func (d *directSender) release(k *keptStep) {
	for i := range k.reqs {
		if k.reqs[i].state == reqSent {
			d.inFly -= len(k.reqs[i].msg.Data)
			k.reqs[i].state = reqReceipted
		}
	}
}

// due marks the requests of shard index i from step from on as due, in every kept step (all
// shards when i < 0), for why. d.mu is held.
func (d *directSender) due(i int, from int64, why sendCause) {
	n := d.w.rec.Layout.NumShards()
	for s := range d.kept {
		k := &d.kept[s]
		if k.step == 0 || k.step < from {
			continue
		}
		for x := range k.reqs {
			if i >= 0 && x%n != i {
				continue
			}
			r := &k.reqs[x]
			if r.state == reqSent {
				d.inFly -= len(r.msg.Data)
			}
			r.state, r.why = reqDue, why
		}
	}
}

// applyNoticesLocked applies the resend notices received. d.mu is held.
func (d *directSender) applyNoticesLocked() {
	for i, from := range d.resend {
		d.due(i, from, sendNotice)
	}
	clear(d.resend)
}

// onNotice records a new owner's "send again from step s" for its shard.
func (d *directSender) onNotice(m *nats.Msg) {
	id, ok := wire.ShardFromSubject(m.Subject)
	from, err := wire.ParseStep(m.Header)
	if !ok || err != nil || id >= d.w.rec.Layout.NumShards() || d.w.rec.Layout.Shards[id].ID != id {
		return
	}
	d.mu.Lock()
	if cur, ok := d.resend[id]; !ok || from < cur {
		d.resend[id] = from
	}
	d.mu.Unlock()
	d.signal()
}

// onAnswer takes a runtime's answer to a gradient request: a receipt, a rejection, or the
// server's "no responders".
func (d *directSender) onAnswer(m *nats.Msg) {
	tok := strings.Split(strings.TrimPrefix(m.Subject, d.inbox+"."), ".")
	if len(tok) != 3 {
		return
	}
	t, err1 := strconv.ParseInt(tok[0], 10, 64)
	j, err2 := strconv.Atoi(tok[1])
	i, err3 := strconv.Atoi(tok[2])
	n := d.w.rec.Layout.NumShards()
	if err1 != nil || err2 != nil || err3 != nil || j < 0 || j >= len(d.w.ranks) || i < 0 || i >= n {
		return
	}
	if rej := m.Header.Get(wire.HdrReject); rej != "" {
		if r, err := wire.UnmarshalReject(m.Data); err == nil {
			select {
			case d.w.rejects <- r:
			default:
			}
		}
	}
	noResp := len(m.Data) == 0 && m.Header.Get("Status") == "503"
	d.mu.Lock()
	k := &d.kept[t%2]
	if k.step == t {
		r := &k.reqs[j*n+i]
		if r.state == reqSent {
			d.inFly -= len(r.msg.Data)
			switch {
			case noResp:
				r.state, r.at = reqNoResponders, time.Now().Add(r.backoff)
				r.backoff = min(2*r.backoff, maxNoRespBackoff)
			default: // a receipt, or a rejection: either way the runtime answered this one
				r.state = reqReceipted
				if !r.resent {
					d.rto.Sample(time.Since(r.at))
				}
			}
		}
	}
	d.mu.Unlock()
	d.signal()
}

// pump sends step t's gradients, and again whatever is due, until ctx ends (the Step's wait is
// over); after stall without every shard's parameters, it sends the missing shards' again. It
// returns the first error a send met.
func (d *directSender) pump(ctx context.Context, t int64, stall time.Duration) error {
	w := d.w
	lost := w.lossMark()
	began := time.Now()
	tick := time.NewTicker(directPoll)
	defer tick.Stop()
	for {
		now := time.Now()
		if m := w.lossMark(); m != lost || now.Sub(began) > stall {
			// Reconnected (a notice may be lost), or a shard's parameters are overdue: again
			// every kept step of the shards still missing.
			lost, began, stall = m, now, min(2*stall, 4*maxFetchAfter)
			d.dueMissing(t)
		}
		if err := d.sendDue(t, now); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-d.wake:
		case <-tick.C:
		}
	}
}

// dueMissing marks every kept request of the shards whose step-t parameters are missing as due.
func (d *directSender) dueMissing(t int64) {
	w := d.w
	w.mu.Lock()
	var missing []int
	for i, g := range w.got {
		if g < t {
			missing = append(missing, i)
		}
	}
	w.mu.Unlock()
	d.mu.Lock()
	for _, i := range missing {
		d.due(i, 0, sendStall)
	}
	d.mu.Unlock()
}

// sendDue sends the requests that are due, oldest step first, within the window; a request
// without a receipt past its timeout is due again. A request of step k for a shard whose step-k
// parameters are in needs no receipt: it is not sent again unless asked (a notice, a stall), but
// it stays kept, for a new owner that restored step k-1 may ask for it.
func (d *directSender) sendDue(t int64, now time.Time) error {
	w := d.w
	n := w.rec.Layout.NumShards()
	w.mu.Lock()
	got := slices.Clone(w.got)
	w.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.applyNoticesLocked()
	slots := []*keptStep{&d.kept[0], &d.kept[1]}
	if slots[0].step > slots[1].step {
		slots[0], slots[1] = slots[1], slots[0]
	}
	for _, k := range slots {
		if k.step == 0 {
			continue
		}
		for x := range k.reqs {
			r := &k.reqs[x]
			if got[x%n] >= k.step && (r.state == reqSent || r.state == reqNoResponders) {
				if r.state == reqSent {
					d.inFly -= len(r.msg.Data)
				}
				r.state = reqReceipted // applied: its parameters are in
				continue
			}
			switch {
			case r.state == reqSent && now.Sub(r.at) > r.timeout:
				d.inFly -= len(r.msg.Data)
				r.timeout = min(2*r.timeout, maxReceiptTimeout)
				r.why = sendTimeout
				d.rto.Backoff(now)
			case r.state == reqNoResponders && !now.Before(r.at):
				r.why = sendNoResponders
			case r.state == reqDue:
			default:
				continue
			}
			if d.inFly > 0 && d.inFly+len(r.msg.Data) > directWindow {
				r.state = reqDue
				return nil // the window is full: answers make room
			}
			if err := w.c.nc.PublishMsg(r.msg); err != nil {
				if errors.Is(err, nats.ErrMaxPayload) {
					s := w.rec.Layout.Shards[x%n]
					return w.pubError(s, w.ranks[x/n], err)
				}
				r.state, r.at = reqNoResponders, now.Add(r.backoff) // disconnected: later
				continue
			}
			d.sends++
			if r.sent {
				d.resends.count(r.why)
			}
			d.inFly += len(r.msg.Data)
			r.resent = r.sent
			r.state, r.at, r.sent = reqSent, now, true
			r.timeout = max(r.timeout, d.rto.Timeout())
		}
	}
	return nil
}

// stepDirect publishes step t's gradients and waits for its parameters, sending again on a gap.
func (w *Worker) stepDirect(ctx context.Context, t int64, grads [][]float32) error {
	w.direct.keep(t, grads)
	// Twice what the fallback waits for a step's last push before it fetches: read here, as the
	// fallback belongs to this goroutine (await notes the step's waits in it).
	stall := 2 * (w.fb.initial() + w.fb.spread())
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	pumped := make(chan error, 1)
	go func() { // owned here: stopped and waited for below
		err := w.direct.pump(pctx, t, stall)
		if err != nil {
			stop() // await returns: the step failed
		}
		pumped <- err
	}()
	err := w.await(pctx, t)
	stop()
	if perr := <-pumped; perr != nil {
		return perr
	}
	return err
}

// DirectSends counts the gradient requests this worker of a direct-gradients job sent, first sends
// and re-sends (0 for other jobs).
func (w *Worker) DirectSends() int64 {
	if w.direct == nil {
		return 0
	}
	w.direct.mu.Lock()
	defer w.direct.mu.Unlock()
	return w.direct.sends
}

// DirectResends counts the gradient requests this worker of a direct-gradients job sent again,
// by cause (zero for other jobs).
func (w *Worker) DirectResends() Resends {
	if w.direct == nil {
		return Resends{}
	}
	w.direct.mu.Lock()
	defer w.direct.mu.Unlock()
	return w.direct.resends
}

var errDirectElastic = fmt.Errorf("elastic workers are not offered for direct-gradient jobs (gradients: direct) yet: use Worker or WorkerRanks")
