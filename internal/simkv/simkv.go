// Package simkv is the deterministic "model" shared by the decoder simulator
// and the sim provider: a reversible tokenizer, the KV cell function, the
// next-token function, the layout hash and the sim's slot state file format.
//
// The model is built so that a handoff that delivers wrong or stale KV changes
// the generated text:
//
//   - cell i holds a Record whose Digest chains the digest stored in cell i-1
//     (as read from KV memory, not recomputed) with token i and its position;
//   - the next token is a function of the K and V records of every live cell.
//
// The model reads layer 0's K and V records only (RecordSize bytes at the
// start of each cell's stride), but by default every layer's K and V of a
// cell hold real bytes derived from its record (Fill), and state files hold
// them all (WriteFullState, version 2), so that moving KV costs what it costs
// llama-server: n_cells x cell size bytes. The --compact switches of the
// simulator and the sim provider write layer 0's records only (state file
// version 1) and leave the rest sparse, for fast tests. Either way the sim
// proves routing and lifetime of KV, not attention.
package simkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Model geometry defaults: Qwen3-0.6B (28 layers, 8 KV heads x 128 dims x f16
// = 2048 bytes per layer per K or V, 114688 bytes per cell).
const (
	DefaultNLayer   = 28
	DefaultCellSize = 114688
	RecordSize      = 32
)

// Special and structural token ids.
const (
	TokBOS   = 1
	TokEOS   = 2
	ByteBase = 3    // ids 3..258 are the bytes 0..255
	WordBase = 1000 // ids WordBase.. are whole words with a leading space
)

// words is the word vocabulary; generation draws only from it so that every
// generated piece is printable ASCII.
var words = []string{
	" the", " a", " of", " and", " to", " in", " is", " it", " that", " was",
	" for", " on", " are", " with", " as", " at", " be", " this", " have", " from",
	" or", " one", " had", " by", " word", " but", " not", " what", " all", " were",
	" we", " when", " your", " can", " said", " there", " use", " an", " each", " which",
	" she", " do", " how", " their", " if", " will", " up", " other", " about", " out",
	" many", " then", " them", " these", " so", " some", " her", " would", " make", " like",
	" him", " into", " time", " has", " look", " two", " more", " write", " go", " see",
	" number", " no", " way", " could", " people", " my", " than", " first", " water", " been",
	" call", " who", " oil", " its", " now", " find", " long", " down", " day", " did",
	" get", " come", " made", " may", " part", " cache", " token", " slot", " decoder", " prefill",
}

var wordID = func() map[string]int {
	m := make(map[string]int, len(words))
	for i, w := range words {
		m[w] = WordBase + i
	}
	return m
}()

// VocabSize is one past the largest valid token id.
func VocabSize() int { return WordBase + len(words) }

// ValidToken reports whether id is a token id of the model: 0 <= id <
// VocabSize(), as llama.cpp validates prompt tokens against n_vocab. Ids
// without a piece (0, 259..WordBase-1) are valid and detokenize to "".
func ValidToken(id int) bool { return id >= 0 && id < VocabSize() }

// Tokenize splits text into token ids: a space followed by a vocabulary word
// (ending at a non-letter) is one token, every other byte is a byte token.
// addSpecial prepends BOS, as llama-server's add_special does.
func Tokenize(text string, addSpecial bool) []int {
	out := make([]int, 0, len(text)/2+1)
	if addSpecial {
		out = append(out, TokBOS)
	}
	for i := 0; i < len(text); {
		if text[i] == ' ' {
			j := i + 1
			for j < len(text) && isLetter(text[j]) {
				j++
			}
			if j > i+1 {
				if id, ok := wordID[text[i:j]]; ok {
					out = append(out, id)
					i = j
					continue
				}
			}
		}
		out = append(out, ByteBase+int(text[i]))
		i++
	}
	return out
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// Piece is the text of one token (BOS and EOS are empty; unknown ids too).
func Piece(id int) string {
	switch {
	case id >= ByteBase && id < ByteBase+256:
		return string([]byte{byte(id - ByteBase)})
	case id >= WordBase && id < WordBase+len(words):
		return words[id-WordBase]
	}
	return ""
}

// Detokenize joins the pieces of ids.
func Detokenize(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(Piece(id))
	}
	return b.String()
}

// ValidUTF8Prefix is the length of the longest prefix of s that does not end
// in the middle of a multi-byte character (what a streaming server may send).
func ValidUTF8Prefix(s string) int {
	for n := len(s); n > 0 && n > len(s)-4; n-- {
		if utf8.ValidString(s[:n]) {
			return n
		}
	}
	if utf8.ValidString(s) {
		return len(s)
	}
	return 0
}

// ModelHash identifies a model file: FNV-1a 64 of its whole contents.
func ModelHash(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("simkv: open model: %w", err)
	}
	defer f.Close()
	h := fnv.New64a()
	if _, err := io.Copy(h, f); err != nil {
		return 0, fmt.Errorf("simkv: read model %s: %w", path, err)
	}
	return h.Sum64(), nil
}

func mix(x uint64) uint64 { // splitmix64 finalizer
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// vSalt makes the V record differ from the K record.
const vSalt = 0x5a5a_c3c3_0f0f_9696

// Record is what one cell holds in layer 0's K region (the V region holds
// the same with Digest ^ vSalt).
type Record struct {
	Digest uint64
	Token  int32
	Pos    int32
	Check  uint64 // mix(Digest ^ Pos): tells an unwritten cell from a written one
}

// Cell computes cell pos's record from the digest stored in cell pos-1
// (0 for pos 0) and the token at pos.
func Cell(model, prevDigest uint64, token, pos int) Record {
	d := mix(prevDigest ^ mix(model^uint64(pos)<<20) ^ uint64(uint32(token))*0x9e3779b97f4a7c15)
	return Record{Digest: d, Token: int32(token), Pos: int32(pos), Check: mix(d ^ uint64(pos))}
}

// Valid reports whether r is a record some Cell produced (its Check matches
// its Digest and Pos): an unwritten cell (zeros) is not.
func Valid(r Record) bool { return r.Check == mix(r.Digest^uint64(uint32(r.Pos))) }

// PutK and PutV encode r into a cell's K and V records (len(b) >= RecordSize).
func PutK(b []byte, r Record) { put(b, r, 0) }
func PutV(b []byte, r Record) { put(b, r, vSalt) }

func put(b []byte, r Record, salt uint64) {
	binary.LittleEndian.PutUint64(b[0:], r.Digest^salt)
	binary.LittleEndian.PutUint32(b[8:], uint32(r.Token))
	binary.LittleEndian.PutUint32(b[12:], uint32(r.Pos))
	binary.LittleEndian.PutUint64(b[16:], r.Check^salt)
	binary.LittleEndian.PutUint64(b[24:], 0)
}

// GetK decodes a K record.
func GetK(b []byte) Record {
	return Record{
		Digest: binary.LittleEndian.Uint64(b[0:]),
		Token:  int32(binary.LittleEndian.Uint32(b[8:])),
		Pos:    int32(binary.LittleEndian.Uint32(b[12:])),
		Check:  binary.LittleEndian.Uint64(b[16:]),
	}
}

// Fold accumulates the K and V records of one live cell into h; the next
// token is a function of Fold over every live cell (see Next).
func Fold(h uint64, k, v []byte) uint64 {
	for i := 0; i < RecordSize; i += 8 {
		h = (h ^ binary.LittleEndian.Uint64(k[i:])) * 0x100000001b3
		h = (h ^ binary.LittleEndian.Uint64(v[i:])) * 0x100000001b3
	}
	return h
}

// FoldInit is the initial value of Fold.
const FoldInit = 0xcbf29ce484222325

// Next is the greedy next token given the fold over all live cells. It is
// EOS about one time in 64; otherwise a word.
func Next(model, fold uint64) int {
	x := mix(fold ^ model)
	if x%64 == 0 {
		return TokEOS
	}
	return WordBase + int((x>>8)%uint64(len(words)))
}

// Layout is everything both sides must agree on for shared KV.
type Layout struct {
	ModelHash uint64
	NCtx      int
	NLayer    int
	CellSize  int
	KVTypeK   string
	KVTypeV   string
	FlashAttn bool
	NBatch    int
	NUbatch   int
}

// Hash is the layout hash: FNV-1a 64 over every field, as 16 hex digits.
func (l Layout) Hash() string {
	h := fnv.New64a()
	fmt.Fprintf(h, "onebit-sim-layout/1|%016x|%d|%d|%d|%s|%s|%t|%d|%d",
		l.ModelHash, l.NCtx, l.NLayer, l.CellSize, l.KVTypeK, l.KVTypeV, l.FlashAttn, l.NBatch, l.NUbatch)
	return fmt.Sprintf("%016x", h.Sum64())
}

// StateHash is the layout hash carried by state files: state compatibility
// depends on the model and the record format only (a state restores into
// any context large enough, as in llama.cpp).
func StateHash(model uint64) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "onebit-sim-state/1|%016x|%d", model, RecordSize)
	return h.Sum64()
}

// Chain computes the records of tokens from scratch (what a prefill does).
func Chain(model uint64, tokens []int) []Record {
	out := make([]Record, len(tokens))
	var prev uint64
	for i, t := range tokens {
		out[i] = Cell(model, prev, t, i)
		prev = out[i].Digest
	}
	return out
}

// ParseFDList parses "3,4,5" into fd numbers.
func ParseFDList(s string) ([]int, error) {
	var fds []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("simkv: bad fd %q in --fds", p)
		}
		fds = append(fds, n)
	}
	if len(fds) == 0 {
		return nil, errors.New("simkv: empty --fds")
	}
	return fds, nil
}
