package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/internal/embed"
	"github.com/fanin-ml/fanin/lab/devstack"
)

func devCmd() *cobra.Command {
	var dataDir, httpAddr string
	var natsPort, runtimes, maxRuntimes int
	var dc demoConfig
	var withDemo, elastic, natsLogs, noAuth bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run all of fanin on an embedded NATS server (with --demo: train a model through it)",
		Example: `  fanin dev --demo --steps 50     # train the demo model for 50 steps, print a summary, exit
  fanin dev --demo --elastic       # the demo's ranks on elastic workers that leave, die and join
  fanin dev                        # serve until Ctrl-C; create jobs with 'fanin jobs create'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if elastic && !withDemo {
				return fmt.Errorf("--elastic goes with --demo")
			}
			if dataDir == "" {
				dataDir = defaultDataDir()
			}
			if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return fmt.Errorf("--data-dir: %w", err)
			}
			log := slog.Default()
			st, err := devstack.Start(cmd.Context(), devstack.Config{
				DataDir: dataDir, NATSPort: natsPort, HTTPAddr: httpAddr, Runtimes: runtimes, MaxRuntimes: maxRuntimes,
				Logger: log, NATSLogs: natsLogs, Auth: !noAuth, AuthDir: devAuthDir(dataDir),
			})
			if errors.Is(err, embed.ErrListen) && errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("--nats-port %d is taken (another fanin dev, or a NATS server?): stop it, or choose another port (-1: any free port): %w", natsPort, err)
			}
			if err != nil {
				return err
			}
			defer st.Close()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "fanin dev %s\n  NATS     %s\n  HTTP API %s\n  data     %s\n  runtimes %d..%d (autoscaled)\n",
				version, st.URL, st.HTTPURL, dataDir, runtimes, max(runtimes, maxRuntimes))
			if err := printDevAuth(out, st, dataDir); err != nil {
				return err
			}
			if withDemo && elastic {
				if !cmd.Flags().Changed("every") {
					dc.every = 10 // 400 steps
				}
				return runElasticDemo(cmd.Context(), st, dc, out)
			}
			if withDemo {
				if err := runDemo(cmd.Context(), st, dc, out); err != nil {
					return err
				}
				if dc.steps > 0 {
					return nil
				}
			}
			fmt.Fprintln(out, "serving; Ctrl-C stops")
			<-cmd.Context().Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "JetStream storage (default: the user cache dir, fanin/dev)")
	f.IntVar(&natsPort, "nats-port", 4222, "NATS client port (-1: any free port)")
	f.StringVar(&httpAddr, "http", "127.0.0.1:8080", "HTTP API listen address (port 0: any free port)")
	f.IntVar(&runtimes, "runtimes", 3, "runtimes the pool starts with, and its minimum")
	f.IntVar(&maxRuntimes, "max-runtimes", 0, "the autoscaler may grow the pool up to this many runtimes (default: --runtimes)")
	f.BoolVar(&natsLogs, "nats-logs", false, "print the embedded NATS server's logs")
	f.BoolVar(&noAuth, "no-auth", false, "run without authentication: open NATS and an open HTTP API")
	f.BoolVar(&withDemo, "demo", false, "train the demo model through fanin")
	f.BoolVar(&elastic, "elastic", false, "with --demo: elastic workers leave, die and join during training; the result is checked against fixed ranks")
	f.IntVar(&dc.steps, "steps", 0, "with --demo: train this many steps, then exit (0: until Ctrl-C; with --elastic, 400)")
	f.IntVar(&dc.ranks, "ranks", 4, "with --demo: workers (logical ranks)")
	f.StringVar(&dc.function, "function", "adam", "with --demo: aggregation function (adam, sgd, momentum, ...)")
	f.Float64Var(&dc.lr, "lr", 0.01, "with --demo: learning rate")
	f.IntVar(&dc.every, "every", 5, "with --demo: print a line every this many steps (with --elastic, default 10)")
	return cmd
}

func defaultDataDir() string {
	if dir, err := os.UserCacheDir(); err == nil {
		return filepath.Join(dir, "fanin", "dev")
	}
	return filepath.Join(os.TempDir(), "fanin-dev")
}
