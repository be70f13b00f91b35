package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"pgregory.net/rapid"

	"github.com/kvgate/kvgate/internal/fixture"
)

// convWords is the vocabulary of the synthetic conversations.
var convWords = strings.Fields(`the a of to and in is it that for on with as was at by be this
have from or one had not but what all were when we there can an your which their said if do
will each about how up out them then she many some so these would other into has more her two
like him see time could no make than first been its who now people my made over did down only
way find use may water long little very after words called just where most know cache token
request model server latency prompt engine block router gateway kernel memory tensor batch
Paris France population capital river museum history tower bridge café naïve façade résumé
Straße München Zürich 東京 大阪 日本語 北京 上海 中文 Москва Россия привет мир 서울 한국어`)

// convText returns deterministic prose of about n bytes: sentences, numbers, a code
// block now and then, blank lines between paragraphs.
func convText(r *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		switch r.IntN(12) {
		case 0:
			fmt.Fprintf(&b, "\n\n```go\nfunc f%d(x int) int {\n\treturn x * %d // %s\n}\n```\n\n", r.IntN(100), r.IntN(1000), convWords[r.IntN(len(convWords))])
		case 1:
			fmt.Fprintf(&b, "In %d, about %d.%d%% of %d items ", 1900+r.IntN(125), r.IntN(100), r.IntN(10), r.IntN(100000))
		case 2:
			b.WriteString("\n\n- ")
		default:
			k := 5 + r.IntN(15)
			for i := range k {
				w := convWords[r.IntN(len(convWords))]
				if i == 0 {
					w = strings.ToUpper(w[:1]) + w[1:]
				}
				b.WriteString(w)
				if i < k-1 {
					b.WriteByte(' ')
				}
			}
			b.WriteString([]string{". ", "? ", "! ", ", and ", "; "}[r.IntN(5)])
		}
	}
	return b.String()
}

type convMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// conversation returns a system prompt and turns user/assistant pairs of about
// userBytes and asstBytes each.
func conversation(seed uint64, turns, userBytes, asstBytes int) []convMessage {
	r := rand.New(rand.NewPCG(seed, 7))
	msgs := []convMessage{{"system", "You are a helpful assistant. " + convText(r, 300)}}
	for range turns {
		msgs = append(msgs, convMessage{"user", convText(r, userBytes)}, convMessage{"assistant", convText(r, asstBytes)})
	}
	return msgs
}

func chatRequest(t testing.TB, msgs []convMessage) ChatRequest {
	t.Helper()
	raw, err := json.Marshal(msgs)
	if err != nil {
		t.Fatal(err)
	}
	return ChatRequest{Messages: raw, AddGenerationPrompt: true}
}

// requestK is the k-th request of a conversation (k >= 1): the system prompt, turns
// 1..k-1 with their replies, and user message k.
func requestK(msgs []convMessage, k int) []convMessage {
	return slices.Clone(msgs[:2*k])
}

// freshTag marks, in a rendered prompt, the text that is new in every request; the
// benchmarks overwrite its digits in place (freshText) so that no iteration allocates
// or renders.
const freshTag = "[#000000]"

// withFresh returns msgs with the last assistant reply (if any) and the last user
// message prefixed with freshTag: the parts of a conversation's request a gateway has
// not seen before (the engine wrote the reply, the client the question).
func withFresh(msgs []convMessage) []convMessage {
	out := slices.Clone(msgs)
	for i := len(out) - 1; i >= 0 && i >= len(out)-2; i-- {
		if out[i].Role != "system" {
			out[i].Content = freshTag + " " + out[i].Content
		}
	}
	return out
}

// freshText rewrites the digits of every freshTag in buf to i.
type freshText struct {
	buf  []byte
	tags []int // offsets of the digits
}

func newFreshText(t testing.TB, s []byte) *freshText {
	f := &freshText{buf: s}
	for i := 0; ; {
		k := strings.Index(string(s[i:]), freshTag)
		if k < 0 {
			break
		}
		f.tags = append(f.tags, i+k+2)
		i += k + len(freshTag)
	}
	if len(f.tags) == 0 {
		t.Fatal("no fresh tag in the prompt")
	}
	return f
}

func (f *freshText) set(i int) {
	for _, off := range f.tags {
		n := i
		for j := 5; j >= 0; j-- {
			f.buf[off+j] = byte('0' + n%10)
			n /= 10
		}
	}
}

// The string aliases buf: valid until the next set (the tokenizer and its caches
// copy what they keep).
func (f *freshText) string() string { return unsafe.String(&f.buf[0], len(f.buf)) }

// multiTurnModels are the real models with chat templates the benchmarks use.
var multiTurnModels = []string{"llama3", "qwen2.5"}

// benchConversation is a system prompt and 10 turns: about 8 000 tokens in all.
func benchConversation() []convMessage { return conversation(1, 10, 1400, 2000) }

// BenchmarkEncodeMultiTurn encodes the 10th request of a 10-turn chat (about 8 000
// tokens, rendered with the model's own template), whose last assistant reply and
// last user message are new in every iteration while the 9 earlier turns repeat, as
// they do across the requests of one conversation. cache=on is the steady state of
// the segment cache, warmed by the conversation's earlier requests; cache=off encodes
// from scratch. p50/p99 are per-request latencies; hit-ratio counts segment lookups
// during the timed loop.
func BenchmarkEncodeMultiTurn(b *testing.B) {
	for _, name := range multiTurnModels {
		tk := loadReal(b, name)
		chat, err := LoadChatTemplate(fixture.Family(b, name))
		if err != nil {
			b.Fatal(err)
		}
		msgs := benchConversation()
		for _, mode := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("%s/cache=%s", name, mode), func(b *testing.B) {
				enc := tk
				if mode == "on" {
					enc = tk.WithSegmentCache(SegmentCacheOptions{MaxBytes: DefaultSegmentCacheBytes})
					for k := 1; k < 10; k++ { // the conversation so far
						text, err := chat.Render(chatRequest(b, requestK(msgs, k)))
						if err != nil {
							b.Fatal(err)
						}
						if _, err := enc.Encode(text, false); err != nil {
							b.Fatal(err)
						}
					}
				}
				text, err := chat.Render(chatRequest(b, withFresh(requestK(msgs, 10))))
				if err != nil {
					b.Fatal(err)
				}
				f := newFreshText(b, []byte(text))
				var dst []uint32
				benchLatencies(b, enc, func(i int) int {
					f.set(i)
					var err error
					if dst, err = enc.AppendEncode(dst[:0], f.string(), false); err != nil {
						b.Fatal(err)
					}
					return len(dst)
				})
			})
		}
	}
}

// BenchmarkTokenizeMultiTurn is BenchmarkEncodeMultiTurn through Registry.Tokenize:
// the chat template is rendered from the request's messages in every iteration, as
// the gateway does.
func BenchmarkTokenizeMultiTurn(b *testing.B) {
	for _, name := range multiTurnModels {
		loadReal(b, name) // skips without the files
		dir := fixture.Family(b, name)
		msgs := benchConversation()
		for _, mode := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("%s/cache=%s", name, mode), func(b *testing.B) {
				opts := RegistryOptions{Strict: true, SegmentCacheBytes: -1}
				if mode == "on" {
					opts.SegmentCacheBytes = 0 // the default
				}
				reg, err := NewRegistry(Config{Models: []ModelConfig{{Name: name, Tokenizer: dir}}}, opts)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				for k := 1; k < 10; k++ {
					if _, err := reg.Tokenize(ctx, Request{Model: name, Chat: new(chatRequest(b, requestK(msgs, k)))}); err != nil {
						b.Fatal(err)
					}
				}
				req := chatRequest(b, withFresh(requestK(msgs, 10)))
				f := newFreshText(b, req.Messages)
				enc := reg.models[name].tok
				benchLatencies(b, enc, func(i int) int {
					f.set(i)
					res, err := reg.Tokenize(ctx, Request{Model: name, Chat: &req})
					if err != nil {
						b.Fatal(err)
					}
					return len(res.Tokens)
				})
			})
		}
	}
}

// benchLatencies runs op in a b.Loop and reports its per-call latency percentiles,
// the tokens of the last call and enc's segment-cache hit ratio during the loop.
func benchLatencies(b *testing.B, enc *Tokenizer, op func(i int) int) {
	lat := make([]time.Duration, 0, 1024)
	tokens := 0
	s0 := enc.SegmentCacheStats()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		tokens = op(i)
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(tokens), "tokens")
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	if s := enc.SegmentCacheStats(); s.Hits+s.Misses > s0.Hits+s0.Misses {
		b.ReportMetric(float64(s.Hits-s0.Hits)/float64(s.Hits+s.Misses-s0.Hits-s0.Misses), "hit-ratio")
	}
}

// BenchmarkSegmentLength compares, per segment length, encoding a segment again
// (warm word cache) with a segment-cache hit: the basis of DefaultSegmentCacheMinBytes.
func BenchmarkSegmentLength(b *testing.B) {
	tk := loadReal(b, "qwen2.5")
	r := rand.New(rand.NewPCG(3, 3))
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64, 128, 256} {
		var sb strings.Builder
		for range 64 {
			sb.WriteString("<|im_start|>")
			s := convText(r, n)
			for len(s) > n {
				s = s[:len(s)-1]
			}
			sb.WriteString(strings.ToValidUTF8(s, ""))
		}
		text := sb.String()
		for _, mode := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("len=%d/cache=%s", n, mode), func(b *testing.B) {
				enc := tk
				if mode == "on" {
					enc = tk.WithSegmentCache(SegmentCacheOptions{MaxBytes: 1 << 20, MinBytes: 1})
				}
				dst, _ := enc.AppendEncode(nil, text, false)
				dst, _ = enc.AppendEncode(dst[:0], text, false)
				b.ReportAllocs()
				for b.Loop() {
					dst, _ = enc.AppendEncode(dst[:0], text, false)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/64, "ns/segment")
			})
		}
	}
}

// cacheSubject is a tokenizer the segment-cache tests compare against itself without a
// cache.
type cacheSubject struct {
	name     string
	ref      *Tokenizer    // no segment cache
	chat     *ChatTemplate // nil: none
	specials []string      // added-token contents, sorted
}

var (
	subjectsOnce sync.Once
	subjects     []cacheSubject
	subjectsErr  error
)

// cacheSubjects returns every synthetic fixture and, when present, every real
// tokenizer (with its chat template).
func cacheSubjects(t testing.TB) []cacheSubject {
	t.Helper()
	fixtures := fixturePipelines(t)
	realDirs := fixture.Optional(t, realFamilies...) // "": absent
	subjectsOnce.Do(func() {
		add := func(name string, tk *Tokenizer, chat *ChatTemplate) {
			var sp []string
			for c := range tk.added.byContent {
				sp = append(sp, c)
			}
			sort.Strings(sp)
			subjects = append(subjects, cacheSubject{name, tk, chat, sp})
		}
		for _, p := range fixtures {
			tk, err := Parse(assembleFixture(t, p))
			if err != nil {
				subjectsErr = fmt.Errorf("%s: %w", p.Name, err)
				return
			}
			add("fixture_"+p.Name, tk, nil)
		}
		for i, name := range realFamilies {
			dir := realDirs[i]
			if dir == "" {
				continue
			}
			tk, err := Load(dir)
			if err != nil {
				subjectsErr = err
				return
			}
			chat, err := LoadChatTemplate(dir)
			if err != nil && !errors.Is(err, ErrNoChatTemplate) {
				subjectsErr = err
				return
			}
			add(name, tk, chat)
		}
	})
	if subjectsErr != nil {
		t.Fatal(subjectsErr)
	}
	return subjects
}

// cacheConfigs are the caches every exactness test runs with: the default, one that
// caches every segment, and small ones under constant eviction pressure.
var cacheConfigs = []struct {
	name string
	opts SegmentCacheOptions
}{
	{"default", SegmentCacheOptions{MaxBytes: DefaultSegmentCacheBytes}},
	{"all", SegmentCacheOptions{MaxBytes: 8 << 20, MinBytes: 1}},
	{"small", SegmentCacheOptions{MaxBytes: 64 << 10, MinBytes: 1}},
	{"tiny", SegmentCacheOptions{MaxBytes: 2048, MinBytes: 1}},
}

// genericChat renders a conversation of turns messages the way chat templates do,
// with the tokenizer's own added tokens around each message (and spaces around some,
// for the lstrip/rstrip tokens): turn i uses contents[i%len(contents)].
func genericChat(specials, contents []string, turns int) string {
	if len(specials) == 0 {
		specials = []string{""}
	}
	var b strings.Builder
	for i := range turns {
		open, end := specials[(2*i)%len(specials)], specials[(2*i+1)%len(specials)]
		b.WriteString(open)
		b.WriteString([]string{"user\n", "assistant\n", " ", "\n\n"}[i%4])
		b.WriteString(contents[i%len(contents)])
		if i%3 == 2 {
			b.WriteString("  ")
		}
		b.WriteString(end)
		b.WriteString("\n")
	}
	return b.String()
}

// cacheTexts returns the texts the exactness tests encode with s: the golden texts,
// generic chats of growing length over them, and, with a chat template, the requests
// of multi-turn conversations of growing length.
func cacheTexts(t testing.TB, s cacheSubject) []string {
	texts := slices.Clone(goldenTexts(t))
	golden := texts[1:]
	for k := 1; k <= 12; k++ {
		texts = append(texts, genericChat(s.specials, golden, k))
		texts = append(texts, genericChat(s.specials[len(s.specials)/2:], golden[k:], k))
	}
	if s.chat != nil {
		for seed := range uint64(2) {
			msgs := conversation(seed+10, 8, 300, 500)
			for k := 1; k <= 8; k++ {
				text, err := s.chat.Render(chatRequest(t, requestK(msgs, k)))
				if err != nil {
					t.Fatalf("%s: render: %v", s.name, err)
				}
				texts = append(texts, text)
			}
		}
		// Messages made of the golden texts (every script, odd whitespace).
		var msgs []convMessage
		for i, g := range golden {
			msgs = append(msgs, convMessage{[]string{"user", "assistant"}[i%2], g})
			if i%2 == 0 {
				if text, err := s.chat.Render(chatRequest(t, msgs)); err == nil {
					texts = append(texts, text)
				}
			}
		}
	}
	return texts
}

type encoded struct {
	plain, special []uint32
}

func encodeRef(t testing.TB, tk *Tokenizer, texts []string) []encoded {
	want := make([]encoded, len(texts))
	for i, s := range texts {
		var err error
		if want[i].plain, err = tk.Encode(s, false); err != nil {
			t.Fatalf("Encode(%q): %v", short(s), err)
		}
		if want[i].special, err = tk.Encode(s, true); err != nil {
			t.Fatalf("Encode(%q): %v", short(s), err)
		}
	}
	return want
}

// TestSegmentCacheExact encodes golden texts and multi-turn chats with every cache
// configuration, cold, warm and again in reverse order, and compares with the encoder
// without a cache; for the real tokenizers also directly with the reference goldens.
func TestSegmentCacheExact(t *testing.T) {
	gtexts := goldenTexts(t)
	for _, s := range cacheSubjects(t) {
		t.Run(s.name, func(t *testing.T) {
			texts := cacheTexts(t, s)
			want := encodeRef(t, s.ref, texts)
			for _, cc := range cacheConfigs {
				tk := s.ref.WithSegmentCache(cc.opts)
				var dst []uint32
				check := func(pass string, i int) {
					var err error
					dst, err = tk.AppendEncode(append(dst[:0], 9), texts[i], false)
					if err != nil || dst[0] != 9 || !slices.Equal(dst[1:], want[i].plain) {
						t.Fatalf("%s %s text %d (%q):\n got %v (%v)\nwant %v", cc.name, pass, i, short(texts[i]), dst, err, want[i].plain)
					}
					got, err := tk.Encode(texts[i], true)
					if err != nil || !slices.Equal(got, want[i].special) {
						t.Fatalf("%s %s text %d with special tokens (%q):\n got %v (%v)\nwant %v", cc.name, pass, i, short(texts[i]), got, err, want[i].special)
					}
				}
				for i := range texts {
					check("cold", i)
				}
				for i := range texts {
					check("warm", i)
				}
				for i := len(texts) - 1; i >= 0; i-- {
					check("reverse", i)
				}
				st := tk.SegmentCacheStats()
				if total, ok := tk.segs.checkAccounting(); !ok || total != st.Bytes || st.Bytes > cc.opts.MaxBytes {
					t.Errorf("%s: accounting broken: %+v (recomputed %d, consistent %v)", cc.name, st, total, ok)
				}
				if cc.name == "all" && st.Hits == 0 {
					t.Errorf("%s: no cache hits: %+v", cc.name, st)
				}
			}
			if !strings.HasPrefix(s.name, "fixture_") {
				var g goldenFile
				readJSON(t, filepath.Join(goldenDir, s.name+".json"), &g)
				tk := s.ref.WithSegmentCache(SegmentCacheOptions{MaxBytes: 1 << 20, MinBytes: 1})
				for range 2 { // cold, then warm
					if n := checkGolden(t, tk, gtexts, &g); n != len(gtexts) {
						t.Errorf("checked %d of %d golden texts", n, len(gtexts))
					}
				}
			}
		})
	}
}

// TestSegmentCacheProperty encodes random texts with added tokens (and pieces of them)
// at random places, and every prefix of them, with a shared cache that accumulates
// across cases and with a tiny one; ids must equal the encoder's without a cache.
func TestSegmentCacheProperty(t *testing.T) {
	subs := cacheSubjects(t)
	big := make([]*Tokenizer, len(subs))
	tiny := make([]*Tokenizer, len(subs))
	for i, s := range subs {
		big[i] = s.ref.WithSegmentCache(SegmentCacheOptions{MaxBytes: 1 << 20, MinBytes: 1})
		tiny[i] = s.ref.WithSegmentCache(SegmentCacheOptions{MaxBytes: 1024, MinBytes: 1})
	}
	fragments := []string{" ", "  ", "\n", "\n\n", "\t", "\u0301", "e\u0301", "é", "ﬁ", "İ", "▁", "Ġ",
		"hello", "Hello world", " world", "'s", "123", "4567", "東京", "привет", "😀", "\u200b", "<", "|>", "<|", "<s", "</"}
	rapid.Check(t, func(rt *rapid.T) {
		i := rapid.IntRange(0, len(subs)-1).Draw(rt, "tokenizer")
		s := subs[i]
		gens := []*rapid.Generator[string]{
			rapid.SampledFrom(fragments),
			rapid.StringN(0, 12, -1),
			rapid.StringOfN(rapid.RuneFrom([]rune(" \n\tab1é\u0301▁.")), 0, 10, -1),
		}
		if len(s.specials) > 0 {
			gens = append(gens, rapid.SampledFrom(s.specials), rapid.SampledFrom(s.specials),
				rapid.Map(rapid.SampledFrom(s.specials), func(sp string) string { return sp[:len(sp)/2] }))
		}
		parts := rapid.SliceOfN(rapid.OneOf(gens...), 1, 20).Draw(rt, "parts")
		var text strings.Builder
		texts := make([]string, 0, 2*len(parts))
		for _, p := range parts {
			text.WriteString(p)
			texts = append(texts, text.String())
		}
		texts = append(texts, texts...) // and again, warm
		for _, x := range texts {
			for _, add := range []bool{false, true} {
				want, werr := s.ref.Encode(x, add)
				for _, tk := range []*Tokenizer{big[i], tiny[i]} {
					got, err := tk.Encode(x, add)
					if (err != nil) != (werr != nil) || !slices.Equal(got, want) {
						rt.Fatalf("%s: Encode(%q, %v) = %v (%v), want %v (%v)", s.name, x, add, got, err, want, werr)
					}
				}
			}
		}
	})
	for i, s := range subs {
		for _, tk := range []*Tokenizer{big[i], tiny[i]} {
			if _, ok := tk.segs.checkAccounting(); !ok {
				t.Errorf("%s: accounting broken: %+v", s.name, tk.SegmentCacheStats())
			}
		}
	}
}

// TestSegmentCacheConcurrent encodes overlapping multi-turn chats from many goroutines
// with a roomy and a tiny (constantly evicting) cache; run with -race.
func TestSegmentCacheConcurrent(t *testing.T) {
	subs := cacheSubjects(t)
	picked := []cacheSubject{subs[0]}
	for _, s := range subs {
		if s.name == "llama3" || s.name == "qwen2.5" || s.name == "fixture_sp_metaspace_first_seq" {
			picked = append(picked, s)
		}
	}
	for _, s := range picked {
		texts := cacheTexts(t, s)
		want := encodeRef(t, s.ref, texts)
		for _, opts := range []SegmentCacheOptions{{MaxBytes: 4 << 20, MinBytes: 1}, {MaxBytes: 4096, MinBytes: 1}} {
			tk := s.ref.WithSegmentCache(opts)
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					var dst []uint32
					for k := range 2 * len(texts) {
						i := (k*7 + g*13) % len(texts)
						var err error
						if dst, err = tk.AppendEncode(dst[:0], texts[i], false); err != nil || !slices.Equal(dst, want[i].plain) {
							t.Errorf("%s goroutine %d text %d: got %v (%v), want %v", s.name, g, i, dst, err, want[i].plain)
							return
						}
					}
				})
			}
			wg.Wait()
			st := tk.SegmentCacheStats()
			if total, ok := tk.segs.checkAccounting(); !ok || total > opts.MaxBytes || st.Hits == 0 {
				t.Errorf("%s: after concurrent use: %+v (recomputed %d, consistent %v)", s.name, st, total, ok)
			}
		}
	}
}

// TestSegmentCacheBounds fills caches of many sizes with random entries and checks
// the byte accounting, the bound, and that what get returns is what was put.
func TestSegmentCacheBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, max := range []int64{1, 200, 1000, 4096, 1 << 20, 3<<20 + 7, 64 << 20} {
		c := newSegCache(SegmentCacheOptions{MaxBytes: max, MinBytes: 1})
		var shardSum int64
		for i := range c.shards {
			shardSum += c.shards[i].budget
		}
		if shardSum > max || len(c.shards) > segMaxShards {
			t.Fatalf("max %d: %d shards with budgets summing to %d", max, len(c.shards), shardSum)
		}
		model := map[string][]uint32{}
		for n := range 3000 {
			key := fmt.Sprintf("%d-%s", r.IntN(500), strings.Repeat("x", r.IntN(3000)))
			first := r.IntN(2) == 0
			h := c.hash(key, first)
			mk := fmt.Sprint(first, key)
			if ids, ok := c.get(h, key, first); ok {
				if !slices.Equal(ids, model[mk]) {
					t.Fatalf("max %d: get(%q) = %v, want %v", max, short(key), ids, model[mk])
				}
				continue
			}
			ids := make([]uint32, r.IntN(200))
			for j := range ids {
				ids[j] = r.Uint32()
			}
			c.put(h, key, first, ids)
			model[mk] = slices.Clone(ids)
			for j := range ids { // the cache keeps its own copy
				ids[j] = 0
			}
			if n%100 == 0 {
				st := c.stats()
				total, ok := c.checkAccounting()
				if !ok || total != st.Bytes || st.Bytes > max {
					t.Fatalf("max %d after %d ops: %+v, recomputed %d, consistent %v", max, n, st, total, ok)
				}
			}
		}
		st := c.stats()
		if st.Bytes > max || (max >= 1<<20 && st.Entries == 0) {
			t.Errorf("max %d: %+v", max, st)
		}
	}
	// An entry larger than the budget is not stored; a hash collision and the first flag
	// are told apart by comparing.
	c := newSegCache(SegmentCacheOptions{MaxBytes: 1000, MinBytes: 1})
	c.put(1, strings.Repeat("y", 1000), false, nil)
	if st := c.stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Errorf("oversized entry stored: %+v", st)
	}
	c.put(7, "abc", false, []uint32{1})
	if _, ok := c.get(7, "abc", true); ok {
		t.Error("hit with the wrong first flag")
	}
	if _, ok := c.get(7, "abd", false); ok {
		t.Error("hit for another text with the same hash")
	}
	c.put(7, "abd", false, []uint32{2})
	if _, ok := c.get(7, "abc", false); ok {
		t.Error("colliding entry not replaced")
	}
	if ids, ok := c.get(7, "abd", false); !ok || !slices.Equal(ids, []uint32{2}) {
		t.Errorf("get after collision = %v, %v", ids, ok)
	}
	if total, ok := c.checkAccounting(); !ok || total != segEntrySize(3, 1) {
		t.Errorf("accounting after collision: %d, %v", total, ok)
	}
	if c := newSegCache(SegmentCacheOptions{}); c != nil {
		t.Error("a zero budget made a cache")
	}
	if c := newSegCache(SegmentCacheOptions{MaxBytes: DefaultSegmentCacheBytes}); len(c.shards) != segMaxShards || c.minLen != DefaultSegmentCacheMinBytes {
		t.Errorf("default cache: %d shards, min %d", len(c.shards), c.minLen)
	}
}

// TestSegmentCacheImmutable: what AppendEncode returns is the caller's to change.
func TestSegmentCacheImmutable(t *testing.T) {
	s := cacheSubjects(t)[0]
	tk := s.ref.WithSegmentCache(SegmentCacheOptions{MaxBytes: 1 << 20, MinBytes: 1})
	text := genericChat(s.specials, goldenTexts(t)[1:], 6)
	want, _ := s.ref.Encode(text, false)
	for range 3 {
		got, err := tk.Encode(text, false)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("got %v (%v), want %v", got, err, want)
		}
		for i := range got {
			got[i] = 1<<32 - 1
		}
	}
	if st := tk.SegmentCacheStats(); st.Hits == 0 {
		t.Errorf("no hits: %+v", st)
	}
	if st := s.ref.SegmentCacheStats(); st != (SegmentCacheStats{}) {
		t.Errorf("stats without a cache: %+v", st)
	}
	if tk.segs == nil || s.ref.segs != nil || s.ref.WithSegmentCache(SegmentCacheOptions{MaxBytes: -1}).segs != nil {
		t.Error("WithSegmentCache: wrong caches")
	}
}

// TestRegistrySegmentCache checks the registry's default cache, its metrics per
// model (two models sharing a tokenizer share its cache), and that disabling it
// changes no ids.
func TestRegistrySegmentCache(t *testing.T) {
	dir := tinyModel(t)
	preg := prometheus.NewRegistry()
	cfg := Config{Models: []ModelConfig{{Name: "m", Tokenizer: dir}, {Name: "n", Tokenizer: dir}}}
	r, err := NewRegistry(cfg, RegistryOptions{Registerer: preg, SegmentCacheMinBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	off, err := NewRegistry(cfg, RegistryOptions{SegmentCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if st := r.models["m"].tok.SegmentCacheStats(); st.MaxBytes != DefaultSegmentCacheBytes || st.MinBytes != 1 {
		t.Errorf("registry cache: %+v", st)
	}
	if off.models["m"].tok.segs != nil || off.models["m"].segHits != nil {
		t.Error("SegmentCacheBytes -1 left a cache")
	}
	ctx := context.Background()
	msgs := []convMessage{{"user", "hello world"}}
	for k := range 4 {
		msgs = append(msgs, convMessage{"assistant", "hello<s>world " + strings.Repeat("hello ", k)}, convMessage{"user", fmt.Sprint("world ", k)})
		for _, req := range []Request{
			{Model: "m", Chat: new(chatRequest(t, msgs))},
			{Model: "n", Text: "hello world<s> hello world<s>" + fmt.Sprint(k)},
		} {
			got, err := r.Tokenize(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			want, err := off.Tokenize(ctx, req)
			if err != nil || !slices.Equal(got.Tokens, want.Tokens) {
				t.Fatalf("%+v: cached %v, uncached %v (%v)", req, got.Tokens, want.Tokens, err)
			}
		}
	}
	st := r.models["m"].tok.SegmentCacheStats()
	hm, hn := testutil.ToFloat64(r.m.segHits.WithLabelValues("m")), testutil.ToFloat64(r.m.segHits.WithLabelValues("n"))
	mm, mn := testutil.ToFloat64(r.m.segMisses.WithLabelValues("m")), testutil.ToFloat64(r.m.segMisses.WithLabelValues("n"))
	if hm == 0 || hn == 0 || mm == 0 || mn == 0 || hm+hn != float64(st.Hits) || mm+mn != float64(st.Misses) {
		t.Errorf("metrics: hits m=%v n=%v, misses m=%v n=%v; cache %+v", hm, hn, mm, mn, st)
	}
	for _, name := range []string{"kvgate_tokenize_segment_cache_hits_total", "kvgate_tokenize_segment_cache_misses_total"} {
		if n, err := testutil.GatherAndCount(preg, name); err != nil || n != 2 {
			t.Errorf("%s: %d series (%v), want 2", name, n, err)
		}
	}
}

// BenchmarkTokenizePaced is the load: Registry.Tokenize of multi-turn chat
// requests at 100 requests/s (one op is one request, paced with a ticker; run with
// e.g. -benchtime=1000x). Ten conversations of 10 turns (about 8 000 tokens at the
// last turn) run interleaved, each request k carrying turns 1..k-1 and a new user
// message; every conversation is new (new seed) when it finishes. p50/p99 are over all
// requests, p99-8k over the 10th requests (about 8 000 tokens); building the request
// and the wait for the next tick are not timed.
func BenchmarkTokenizePaced(b *testing.B) {
	for _, name := range multiTurnModels {
		loadReal(b, name)
		dir := fixture.Family(b, name)
		for _, mode := range []string{"off", "on"} {
			b.Run(fmt.Sprintf("%s/cache=%s", name, mode), func(b *testing.B) {
				opts := RegistryOptions{Strict: true, SegmentCacheBytes: -1}
				if mode == "on" {
					opts.SegmentCacheBytes = 0
				}
				reg, err := NewRegistry(Config{Models: []ModelConfig{{Name: name, Tokenizer: dir}}}, opts)
				if err != nil {
					b.Fatal(err)
				}
				const convs, turns = 10, 10
				seeds := make([]uint64, convs)
				msgs := make([][]convMessage, convs)
				for c := range convs {
					seeds[c] = uint64(100 + c)
					msgs[c] = conversation(seeds[c], turns, 1400, 2000)
				}
				ctx := context.Background()
				var all, last []time.Duration
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					c, k := i%convs, (i/convs)%turns+1
					if k == 1 && i >= convs {
						seeds[c] += convs
						msgs[c] = conversation(seeds[c], turns, 1400, 2000)
					}
					req := Request{Model: name, Chat: new(chatRequest(b, requestK(msgs[c], k)))}
					<-tick.C
					b.StartTimer()
					start := time.Now()
					if _, err := reg.Tokenize(ctx, req); err != nil {
						b.Fatal(err)
					}
					d := time.Since(start)
					all = append(all, d)
					if k == turns {
						last = append(last, d)
					}
				}
				slices.Sort(all)
				slices.Sort(last)
				b.ReportMetric(float64(all[len(all)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds())/1e3, "p99-µs")
				if len(last) > 0 {
					b.ReportMetric(float64(last[len(last)*99/100].Nanoseconds())/1e3, "p99-8k-µs")
				}
			})
		}
	}
}
