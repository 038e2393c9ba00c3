package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/fanin-ml/fanin/gateway"
	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/devstack"
	"github.com/fanin-ml/fanin/job"
)

func authCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "auth", Short: "Set up fanin's security for an external NATS server"}
	var dir string
	initCmd := &cobra.Command{
		Use:   "init --dir DIR",
		Short: "Create (or reuse) the NATS operator, accounts and credentials, and the API's admin token",
		Long: `init writes to DIR (mode 0700; secrets 0600):

  operator.nk system.nk account.nk signer.nk   the keys (keep them secret; the gateway needs DIR)
  admin.token                                  the API's admin token
  nats-server.conf                             include it in the NATS server's configuration
  gateway.creds runtime.creds autoscaler.creds the components' NATS credentials (--creds)
  operator.creds                               full access to fanin's account, for the nats CLI

Then: fanin gateway --auth-dir DIR (it connects with DIR/gateway.creds); fanin runtime|autoscaler
--creds DIR/<name>.creds. Running
it again reuses the keys and writes fresh credentials.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir is required")
			}
			a, err := auth.Load(dir)
			if err != nil {
				return err
			}
			conf, err := a.ServerConfig()
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "nats-server.conf"), []byte(conf), 0o600); err != nil {
				return err
			}
			for _, name := range []string{"gateway", "runtime", "autoscaler", "operator"} {
				c, err := a.ComponentCredentials("fanin-" + name)
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, name+".creds"), []byte(c.File()), 0o600); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "fanin auth in %s (account %s)\n", dir, a.AccountKey())
			fmt.Fprintf(out, "  NATS server:  include %s in its configuration\n", filepath.Join(dir, "nats-server.conf"))
			fmt.Fprintf(out, "  gateway:      fanin gateway --nats URL --auth-dir %s\n", dir)
			fmt.Fprintf(out, "  runtimes:     fanin runtime --nats URL --creds %s\n", filepath.Join(dir, "runtime.creds"))
			fmt.Fprintf(out, "  autoscaler:   fanin autoscaler --nats URL --creds %s\n", filepath.Join(dir, "autoscaler.creds"))
			fmt.Fprintf(out, "  CLI:          export FANIN_TOKEN=$(cat %s)\n", auth.AdminTokenFile(dir))
			return nil
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", envOr("FANIN_AUTH_DIR", ""), "directory of the keys and credentials (env FANIN_AUTH_DIR)")
	cmd.AddCommand(initCmd)
	return cmd
}

// gatewayFlags are the gateway's security and quota flags.
type gatewayFlags struct {
	token, authDir, bps string
	credsTTL            time.Duration
	quota               api.Quota
}

func (g *gatewayFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&g.token, "token", "", "the API's admin token (env FANIN_TOKEN; default with --auth-dir: DIR/admin.token; none: the API is open)")
	f.StringVar(&g.authDir, "auth-dir", envOr("FANIN_AUTH_DIR", ""), "keys from 'fanin auth init': issue per-job NATS credentials and revoke them (env FANIN_AUTH_DIR)")
	f.DurationVar(&g.credsTTL, "creds-ttl", 0, "job credentials expire after this (default: when the job is deleted)")
	f.IntVar(&g.quota.Jobs, "quota-jobs", 0, "jobs the admin token may own (team tokens carry their own quota; 0: no limit)")
	f.IntVar(&g.quota.Shards, "quota-shards", 0, "shards per job created with the admin token (0: no limit)")
	f.StringVar(&g.bps, "quota-bytes-per-second", "", "gradient bytes per second per job created with the admin token, e.g. 100MiB")
}

// defaults completes the NATS flags: with --auth-dir and no --creds, the gateway connects with the
// credentials 'fanin auth init' wrote for it.
func (g *gatewayFlags) defaults(nf *natsFlags) {
	if nf.creds == "" && g.authDir != "" {
		nf.creds = filepath.Join(g.authDir, "gateway.creds")
	}
}

// options returns the gateway's options from the flags, and a function that closes what they
// opened (the system account connection).
func (g *gatewayFlags) options(natsURL string) ([]gateway.Option, func(), error) {
	closeAll := func() {}
	tok := g.token
	if tok == "" {
		tok = envOr("FANIN_TOKEN", "")
	}
	if g.bps != "" {
		n, err := job.ParseByteSize(g.bps)
		if err != nil {
			return nil, closeAll, fmt.Errorf("--quota-bytes-per-second: %w", err)
		}
		g.quota.BytesPerSecond = int64(n)
	}
	opts := []gateway.Option{gateway.WithDefaultQuota(g.quota), gateway.WithCredentialsTTL(g.credsTTL)}
	if g.authDir != "" {
		a, err := auth.Load(g.authDir)
		if err != nil {
			return nil, closeAll, err
		}
		if tok == "" {
			tok = a.AdminToken()
		}
		sc, err := a.SystemCredentials("fanin-gateway-system")
		if err != nil {
			return nil, closeAll, err
		}
		sys, err := nats.Connect(natsURL, append(sc.NATSOptions(), nats.Name("fanin-gateway-system"), nats.MaxReconnects(-1))...)
		if err != nil {
			return nil, closeAll, fmt.Errorf("connect to NATS's system account: %w", err)
		}
		closeAll = sys.Close
		opts = append(opts, gateway.WithAuthority(a, sys))
	}
	if tok != "" {
		opts = append(opts, gateway.WithAdminToken(tok))
	}
	return opts, closeAll, nil
}

// printDevAuth tells the user of `fanin dev` how to reach it: where the admin token is (never the
// token itself: terminals and CI logs keep what they print) and a .creds file for the nats CLI.
func printDevAuth(w io.Writer, st *devstack.Stack, dataDir string) error {
	if st.Authority == nil {
		fmt.Fprintln(w, "  auth     off (--no-auth): NATS and the HTTP API are open")
		return nil
	}
	dir := devAuthDir(dataDir)
	c, err := st.Authority.ComponentCredentials("fanin-dev-operator")
	if err != nil {
		return err
	}
	credsFile := filepath.Join(dir, "operator.creds")
	if err := os.WriteFile(credsFile, []byte(c.File()), 0o600); err != nil {
		return err
	}
	if dataDir == defaultDataDir() {
		fmt.Fprintf(w, "  auth     on: the fanin CLI on this machine reads the admin token from %s\n", auth.AdminTokenFile(dir))
	} else {
		fmt.Fprintf(w, "  auth     on: export FANIN_TOKEN=$(cat %s)\n", auth.AdminTokenFile(dir))
	}
	fmt.Fprintf(w, "           nats --server %s --creds %s ...   (full access; jobs get their own credentials)\n", st.URL, credsFile)
	return nil
}
