// Command fakeruntime plays fanin's runtime for the Python package's tests (tests/test_params_dtype.py):
// it starts an embedded NATS server with JetStream (no auth), creates one job from the spec given
// as its argument (record and streams as fanin makes them), stores its initial parameters in f32,
// and prints the server's URL. Then, for every line on stdin
//
//	serve <step> <dtype> <file> [<shard> <header-dtype> <bytes>]
//
// it waits until the job's gradient stream holds a gradient of step (or later) for every shard,
// and publishes each shard's parameters after step: the little-endian float32 vector in file,
// encoded in dtype (f32, bf16, f16; rounded to nearest even) under Fanin-Dtype: dtype. With the
// optional three fields, that shard's message is instead <bytes> zero bytes under Fanin-Dtype:
// <header-dtype> (a message a worker must refuse). It answers "ok", or "error: ..." and goes on.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/wire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fakeruntime:", err)
		os.Exit(1)
	}
}

type fake struct {
	js  jetstream.JetStream
	rec job.Record
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: fakeruntime '<job spec JSON>'")
	}
	var s job.Spec
	if err := json.Unmarshal([]byte(os.Args[1]), &s); err != nil {
		return err
	}
	s.Normalize()
	if err := s.Validate(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "fakeruntime-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: dir})
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := &fake{js: js, rec: job.NewRecord(s, time.Now())}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.JobsBucket})
	if err != nil {
		return err
	}
	val, _ := json.Marshal(f.rec)
	if _, err := kv.Put(ctx, s.ID, val); err != nil {
		return err
	}
	if err := store.CreateJobStreams(ctx, js, &f.rec, nc.MaxPayload(), nil); err != nil {
		return err
	}
	p0 := make([]float32, f.rec.Layout.Elements)
	s.InitShard(0, p0)
	if err := f.publish(0, wire.F32, p0, -1, "", 0); err != nil {
		return err
	}
	fmt.Println(ns.ClientURL())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if err := f.serve(strings.Fields(in.Text())); err != nil {
			fmt.Println("error:", err)
		} else {
			fmt.Println("ok")
		}
	}
	return in.Err()
}

func (f *fake) serve(args []string) error {
	if len(args) != 4 && len(args) != 7 || args[0] != "serve" {
		return fmt.Errorf("want: serve <step> <dtype> <file> [<shard> <header-dtype> <bytes>], got %q", args)
	}
	step, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil {
		return err
	}
	dt, ok := wire.ParseDtype(args[2])
	if !ok {
		return fmt.Errorf("dtype %q", args[2])
	}
	raw, err := os.ReadFile(args[3])
	if err != nil {
		return err
	}
	if len(raw) != 4*f.rec.Layout.Elements {
		return fmt.Errorf("%s: %d bytes for %d parameters", args[3], len(raw), f.rec.Layout.Elements)
	}
	v := make([]float32, f.rec.Layout.Elements)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	bad, badDtype, badBytes := -1, "", 0
	if len(args) == 7 {
		if bad, err = strconv.Atoi(args[4]); err != nil {
			return err
		}
		badDtype = args[5]
		if badBytes, err = strconv.Atoi(args[6]); err != nil {
			return err
		}
	}
	if err := f.waitGrads(step); err != nil {
		return err
	}
	return f.publish(step, dt, v, bad, badDtype, badBytes)
}

// waitGrads waits until every shard's newest gradient is of step or later.
func (f *fake) waitGrads(step int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := f.rec.Spec.ID
	stream, err := f.js.Stream(ctx, wire.GradStream(id))
	if err != nil {
		return err
	}
	for _, s := range f.rec.Layout.Shards {
		for {
			m, err := stream.GetLastMsgForSubject(ctx, wire.GradSubject(id, s.ID))
			if err == nil {
				if got, _ := wire.ParseStep(m.Header); got >= step {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("no gradient of step %d for shard %d: %w", step, s.ID, ctx.Err())
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	return nil
}

func (f *fake) publish(step int64, dt wire.Dtype, v []float32, bad int, badDtype string, badBytes int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := f.rec.Spec.ID
	for _, s := range f.rec.Layout.Shards {
		data := make([]byte, dt.ElemSize()*s.Len)
		wire.Encode(data, v[s.Off:s.Off+s.Len], dt)
		m := wire.ParamsMsg(id, "", s.ID, step, uint64(step), data)
		wire.SetParamsHeaders(m.Header, id, "", s.ID, step, uint64(step), dt)
		if s.ID == bad {
			m.Data = make([]byte, badBytes)
			m.Header.Set(wire.HdrDtype, badDtype)
		}
		if _, err := f.js.PublishMsg(ctx, m); err != nil {
			return err
		}
	}
	return nil
}
