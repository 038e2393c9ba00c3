package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
)

// natsCmd is nats-server itself, of the version fanin is built with and tested against (go.mod):
// `fanin nats --config FILE` is `nats-server --config FILE`, every flag of nats-server's included.
// fanin's image runs it for deploy/kubernetes's NATS cluster, so that cluster needs no second image
// and its servers are always the version fanin's tests ran.
func natsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "nats [nats-server flags]",
		Short: "Run nats-server (the version fanin embeds) with nats-server's own flags, e.g. --config FILE",
		// nats-server parses its flags itself (server.ConfigureOptions), exactly as its main does.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			fs := flag.NewFlagSet("fanin nats", flag.ContinueOnError)
			fs.SetOutput(cmd.ErrOrStderr())
			// --version, --help and --help_tls print and return no options (nats-server exits there).
			version := func() { fmt.Fprintf(cmd.OutOrStdout(), "nats-server: v%s\n", server.VERSION) }
			opts, err := server.ConfigureOptions(fs, args, version, fs.PrintDefaults, fs.PrintDefaults)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("nats: %w", err)
			}
			if opts == nil {
				return nil
			}
			if opts.CheckConfig {
				fmt.Fprintf(cmd.ErrOrStderr(), "fanin nats: configuration file %s is valid\n", opts.ConfigFile)
				return nil
			}
			s, err := server.NewServer(opts)
			if err != nil {
				return fmt.Errorf("nats: %w", err)
			}
			s.ConfigureLogger()
			if err := server.Run(s); err != nil {
				return fmt.Errorf("nats: %w", err)
			}
			// nats-server handles SIGTERM and SIGINT itself (shutdown) and SIGUSR2 (lame duck mode);
			// the command's context ends on the same signals.
			go func() {
				<-cmd.Context().Done()
				s.Shutdown()
			}()
			s.WaitForShutdown()
			return nil
		},
	}
}
