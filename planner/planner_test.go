package planner

import (
	"math"
	"sync"
	"testing"
)

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		ok   bool
	}{{"", ModeAuto, true}, {"auto", ModeAuto, true}, {"always", ModeAlways, true}, {"never", ModeNever, true}, {"sometimes", "", false}} {
		got, err := ParseMode(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParseMode(%q) = %q, %v", tc.in, got, err)
		}
	}
}

// trained is a model that has seen a decoder at decMs per token and a
// provider of fixed + per-token ms, and overhead ms per handoff.
func trained(mode Mode, decMs, fixed, per, over float64) *Model {
	m := NewModel(mode, 1024)
	m.ExploreEvery = 0
	for _, n := range []int{10, 100, 1000, 5000, 12000} {
		m.ObserveDecoder(n, decMs*float64(n))
		m.ObserveProvider(n, fixed+per*float64(n))
		m.ObserveHandoff("shared", over)
	}
	return m
}

func TestEstimates(t *testing.T) {
	m := trained(ModeAuto, 1.0, 20, 0.2, 1.5)
	e := m.Estimates()
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6*max(1, b) }
	if !near(e.DecoderMsPerToken, 1) || !near(e.ProviderFixedMs, 20) || !near(e.ProviderMsPerToken, 0.2) || !near(e.HandoffMs["shared"], 1.5) {
		t.Fatalf("estimates %+v", e)
	}
	// One distinct x: no slope to fit, the line goes through the origin.
	m = NewModel(ModeAuto, 0)
	for range 3 {
		m.ObserveProvider(100, 50)
	}
	if e := m.Estimates(); e.ProviderFixedMs != 0 || !near(e.ProviderMsPerToken, 0.5) {
		t.Fatalf("one x: %+v", e)
	}
	// Garbage is ignored.
	m.ObserveDecoder(0, 5)
	m.ObserveDecoder(10, math.NaN())
	m.ObserveProvider(10, math.Inf(1))
	m.ObserveHandoff("shared", -1)
	if e := m.Estimates(); e.DecoderSamples != 0 || e.ProviderSamples != 3 || len(e.HandoffMs) != 0 {
		t.Fatalf("garbage counted: %+v", e)
	}
}

// TestDecay: old samples fade, so the estimate follows a decoder that got
// slower.
func TestDecay(t *testing.T) {
	m := NewModel(ModeAuto, 0)
	for range 50 {
		m.ObserveDecoder(100, 100)
	}
	for range 50 {
		m.ObserveDecoder(100, 300)
	}
	if got := m.Estimates().DecoderMsPerToken; got < 2.8 {
		t.Fatalf("decoder ms/token %.3f after the decoder tripled, want ≈3", got)
	}
}

func TestDecide(t *testing.T) {
	// Break-even of trained(1, 20, 0.2, 1): n·1 = 21 + 0.2 n → n ≈ 26;
	// with a 10 % margin ≈ 30.
	tests := []struct {
		name          string
		m             *Model
		n, held       int
		incremental   bool
		choice        Choice
		basis         string
		prefill, strt int
	}{
		{"never", trained(ModeNever, 1, 20, 0.2, 1), 5000, 0, true, Skip, BasisNever, 5000, 0},
		{"always, incremental", trained(ModeAlways, 1, 20, 0.2, 1), 5000, 4000, true, Handoff, BasisAlways, 1000, 4000},
		{"always, file route", trained(ModeAlways, 1, 20, 0.2, 1), 5000, 4000, false, Handoff, BasisAlways, 5000, 0},
		{"floor, short", NewModel(ModeAuto, 1024), 500, 0, true, Skip, BasisFloor, 500, 0},
		{"floor, long", NewModel(ModeAuto, 1024), 2000, 0, true, Handoff, BasisFloor, 2000, 0},
		{"floor counts the tokens not held", NewModel(ModeAuto, 1024), 2000, 1500, true, Skip, BasisFloor, 500, 0},
		{"model, short", trained(ModeAuto, 1, 20, 0.2, 1), 10, 0, true, Skip, BasisModel, 10, 0},
		{"model, long", trained(ModeAuto, 1, 20, 0.2, 1), 12000, 0, true, Handoff, BasisModel, 12000, 0},
		{"model, long but held", trained(ModeAuto, 1, 20, 0.2, 1), 12000, 11990, true, Skip, BasisModel, 10, 0},
		{"model, long suffix", trained(ModeAuto, 1, 20, 0.2, 1), 12000, 6000, true, Handoff, BasisModel, 6000, 6000},
		{"file route: provider redoes the prefix", trained(ModeAuto, 1, 20, 0.2, 1), 1000, 950, false, Skip, BasisModel, 50, 0},
		{"all held", trained(ModeAuto, 1, 20, 0.2, 1), 1000, 1000, true, Skip, BasisHeld, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.m.Decide(tc.n, tc.held, tc.incremental, "shared")
			if d.Choice != tc.choice || d.Basis != tc.basis || d.TokensPrefill != tc.prefill || d.Start != tc.strt {
				t.Fatalf("got %+v, want %s/%s prefill %d start %d", d, tc.choice, tc.basis, tc.prefill, tc.strt)
			}
			if tc.basis == BasisModel && (d.DecoderUS == 0 || d.HandoffUS == 0) {
				t.Fatalf("model decision without predictions: %+v", d)
			}
		})
	}
}

// TestExploreBounded: near the break-even one decision in ExploreEvery
// takes the other side; far from it, none does.
func TestExploreBounded(t *testing.T) {
	m := trained(ModeAuto, 1, 20, 0.2, 1)
	m.ExploreEvery = 4
	count := func(n int) (explored int) {
		for range 40 {
			if m.Decide(n, 0, true, "shared").Basis == BasisExplore {
				explored++
			}
		}
		return explored
	}
	if got := count(30); got != 10 {
		t.Fatalf("near the break-even: %d explorations in 40, want 10", got)
	}
	if got := count(12000); got != 0 {
		t.Fatalf("far from the break-even: %d explorations", got)
	}
}

func TestMemory(t *testing.T) {
	toks := []int{1, 2, 3, 4, 5}
	m := NewMemory(2)
	held, tk := m.Take(0, toks)
	if held != 0 {
		t.Fatalf("empty slot holds %d", held)
	}
	if m.Held(0, toks) != 0 {
		t.Fatal("unconfirmed memory trusted")
	}
	if !m.Confirm(tk, toks) || m.Held(0, []int{1, 2, 3, 9}) != 3 || m.Held(1, toks) != 0 {
		t.Fatal("confirmed prefix not held")
	}
	// A second Confirm with the same ticket after a new Take is void.
	_, tk2 := m.Take(0, toks)
	if m.Held(0, toks) != 0 {
		t.Fatal("a taken slot is still trusted")
	}
	if m.Confirm(tk, toks) {
		t.Fatal("an old ticket confirmed")
	}
	if !m.Confirm(tk2, toks) {
		t.Fatal("the current ticket did not confirm")
	}
	// Forget and ForgetAll void what is held and the tickets in flight.
	m.Forget(0)
	if m.Held(0, toks) != 0 {
		t.Fatal("forgotten slot trusted")
	}
	_, tk3 := m.Take(0, toks)
	m.ForgetAll()
	if m.Confirm(tk3, toks) || m.Held(0, toks) != 0 {
		t.Fatal("a ticket taken before ForgetAll confirmed")
	}
	_, tk4 := m.Take(1, toks)
	m.Forget(1)
	if m.Confirm(tk4, toks) {
		t.Fatal("a ticket taken before Forget confirmed")
	}
	if h, tk := m.Take(7, toks); h != 0 || m.Confirm(tk, toks) {
		t.Fatal("slot out of range")
	}
}

func TestMemoryConcurrent(t *testing.T) {
	m := NewMemory(4)
	toks := []int{1, 2, 3}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 500 {
				_, tk := m.Take(i%4, toks)
				if j%50 == 0 {
					m.ForgetAll()
				}
				m.Confirm(tk, toks)
				m.Held(j%4, toks)
			}
		}()
	}
	wg.Wait()
}

// TestMemoryIdentity: a changed decoder identity forgets every slot and
// voids the tickets taken under the old one.
func TestMemoryIdentity(t *testing.T) {
	toks := []int{1, 2, 3}
	m := NewMemory(1)
	if !m.Observe(7) || m.Observe(7) {
		t.Fatal("Observe reports changes only")
	}
	_, tk := m.Take(0, toks)
	m.Confirm(tk, toks)
	held, tk := m.Take(0, toks)
	if held != 3 || !m.Valid(tk, 7) {
		t.Fatalf("held %d, valid %v", held, m.Valid(tk, 7))
	}
	if m.Valid(tk, 8) {
		t.Fatal("valid under another decoder")
	}
	m.Observe(8)
	if m.Valid(tk, 8) || m.Confirm(tk, toks) || m.Held(0, toks) != 0 {
		t.Fatal("a ticket of the old decoder survived its restart")
	}
}
