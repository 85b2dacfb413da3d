// Command llmproxy runs the proxy: configuration from LLMPROXY_* variables,
// a proxy listener and an admin listener, and a graceful stop on SIGTERM or
// SIGINT (a second one, or LLMPROXY_SHUTDOWN_TIMEOUT, ends the wait).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/llmproxy/llmproxy/internal/buildinfo"
)

func main() {
	first, again := stopSignals()
	os.Exit(run(first, again, os.Args[1:], environ(), os.Stdout, os.Stderr, nil))
}

// stopSignals ends the context at the first SIGTERM or SIGINT (drain) and
// delivers the later ones on the channel (stop now).
func stopSignals() (context.Context, <-chan os.Signal) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-sigs
		cancel()
	}()
	return ctx, sigs
}

func environ() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// run is main without the process: it returns the exit code. ctx ends at
// the first stop signal; again delivers the later ones.
func run(ctx context.Context, again <-chan os.Signal, args []string, environ map[string]string, stdout, stderr io.Writer, up listening) int {
	if len(args) == 0 {
		return serve(ctx, again, environ, stderr, up)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		printUsage(stdout)
		return 0
	case "version", "-version", "--version":
		fmt.Fprint(stdout, buildinfo.Read().Describe())
		return 0
	case "healthcheck", "status", "limits", "hold", "release", "clear", "journal":
		cfg, err := loadConfig(environ)
		if err != nil {
			fmt.Fprintln(stderr, "llmproxy:", err)
			return 2
		}
		switch args[0] {
		case "healthcheck":
			return healthcheck(cfg.AdminAddr, stderr)
		case "status":
			return status(ctx, args[1:], cfg.AdminAddr, cfg.AdminToken, stdout, stderr)
		case "journal":
			return journalCommand(ctx, args[1:], cfg, stdout, stderr)
		}
		return operate(ctx, args[0], args[1:], cfg.AdminAddr, cfg.AdminToken, stdout, stderr)
	}
	fmt.Fprintf(stderr, "llmproxy: unknown argument %q (try -h)\n", args[0])
	return 2
}
