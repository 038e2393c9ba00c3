// Command natsonly is the baseline of the SDK's size test: a program that does what a worker does
// with nats.go alone (a connection, a core subscription, a JetStream publish), so that its size is
// what any NATS worker pays before fanin adds anything.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natsonly:", err)
		os.Exit(1)
	}
}

func run() error {
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	sub, err := nc.Subscribe("params", func(m *nats.Msg) { fmt.Println(len(m.Data)) })
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	_, err = js.PublishMsg(context.Background(), nats.NewMsg("grads"))
	return err
}
