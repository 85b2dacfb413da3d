package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// profileUnderLoad runs chats by wrk at 32 connections against llmproxy
// for d while taking a CPU profile of all but its first and last half
// second, then writes the allocation, heap, mutex and block profiles
// beside it in dir.
func profileUnderLoad(p *process, script string, d time.Duration, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	secs := max(1, int((d - time.Second).Seconds()))
	cpu := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		cpu <- fetchProfile(p.admin, "profile?seconds="+strconv.Itoa(secs), filepath.Join(dir, "cpu.pprof"), time.Duration(secs+30)*time.Second)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	s, err := wrkLoad(script, 32)(ctx, target{"llmproxy", p.base, p.pid()}, d)
	if err != nil {
		return err
	}
	if err := <-cpu; err != nil {
		return err
	}
	for _, name := range []string{"allocs", "heap", "mutex", "block"} {
		if err := fetchProfile(p.admin, name, filepath.Join(dir, name+".pprof"), 30*time.Second); err != nil {
			return err
		}
	}
	fmt.Printf("wrk 32 connections through llmproxy: %.0f req/s, p50 %v, p99 %v, CPU %.3f s per 1k, failed %d\n",
		s.rps, s.p50, s.p99, s.cpuPer1k, s.failed)
	fmt.Printf("profiles in %s; read them with: go tool pprof -top %s\n", dir, filepath.Join(dir, "cpu.pprof"))
	return nil
}

// fetchProfile saves the admin listener's /debug/pprof/<name> to path.
func fetchProfile(admin, name, path string, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get("http://" + admin + "/debug/pprof/" + name)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/debug/pprof/%s: %s", name, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
