package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// This file reads request bodies in one pass: a chat body is tens of
// kilobytes, nearly all of it messages the tokenizer reads again, and
// encoding/json would scan it twice (validation, then decoding) only to
// keep most of it as raw bytes.

// maxJSONDepth is encoding/json's nesting limit.
const maxJSONDepth = 10000

// errNotObject: the body is valid JSON but not an object.
var errNotObject = errors.New("want a JSON object")

// scanObject checks that doc is valid JSON (as encoding/json.Valid) whose
// top level is an object, and calls member with each top-level member's
// key (unescaped) and raw value, in order.
func scanObject(doc []byte, member func(key string, raw []byte)) error {
	s := scanner{doc: doc}
	s.space()
	if s.i >= len(doc) {
		return errors.New("unexpected end of JSON input")
	}
	if doc[s.i] != '{' {
		if err := s.value(0); err != nil {
			return err
		}
		if s.space(); s.i < len(doc) {
			return s.errorf("after top-level value")
		}
		return errNotObject
	}
	s.i++
	s.space()
	if s.i < len(doc) && doc[s.i] == '}' {
		s.i++
	} else {
		for {
			s.space()
			k0 := s.i
			esc, err := s.str()
			if err != nil {
				return err
			}
			key := doc[k0+1 : s.i-1]
			if s.space(); s.i >= len(doc) || doc[s.i] != ':' {
				return s.errorf("after object key")
			}
			s.i++
			s.space()
			v0 := s.i
			if err := s.value(1); err != nil {
				return err
			}
			k := string(key)
			if esc {
				if err := json.Unmarshal(doc[k0:k0+len(key)+2], &k); err != nil {
					return fmt.Errorf("object key: %w", err)
				}
			}
			member(k, doc[v0:s.i])
			s.space()
			if s.i >= len(doc) {
				return errors.New("unexpected end of JSON input")
			}
			if doc[s.i] == '}' {
				s.i++
				break
			}
			if doc[s.i] != ',' {
				return s.errorf("after object key:value pair")
			}
			s.i++
		}
	}
	if s.space(); s.i < len(doc) {
		return s.errorf("after top-level value")
	}
	return nil
}

type scanner struct {
	doc []byte
	i   int
}

func (s *scanner) errorf(where string) error {
	if s.i >= len(s.doc) {
		return errors.New("unexpected end of JSON input")
	}
	return fmt.Errorf("invalid character %q %s at offset %d", s.doc[s.i], where, s.i)
}

func (s *scanner) space() {
	for s.i < len(s.doc) {
		switch s.doc[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value scans one value at nesting depth.
func (s *scanner) value(depth int) error {
	if s.i >= len(s.doc) {
		return errors.New("unexpected end of JSON input")
	}
	switch c := s.doc[s.i]; {
	case c == '"':
		_, err := s.str()
		return err
	case c == '{' || c == '[':
		if depth+1 > maxJSONDepth {
			return errors.New("exceeded max depth")
		}
		return s.composite(c, depth+1)
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return s.errorf("looking for beginning of value")
}

func (s *scanner) composite(open byte, depth int) error {
	close := byte('}')
	if open == '[' {
		close = ']'
	}
	s.i++
	s.space()
	if s.i < len(s.doc) && s.doc[s.i] == close {
		s.i++
		return nil
	}
	for {
		s.space()
		if open == '{' {
			if _, err := s.str(); err != nil {
				return err
			}
			if s.space(); s.i >= len(s.doc) || s.doc[s.i] != ':' {
				return s.errorf("after object key")
			}
			s.i++
			s.space()
		}
		if err := s.value(depth); err != nil {
			return err
		}
		s.space()
		if s.i >= len(s.doc) {
			return errors.New("unexpected end of JSON input")
		}
		switch s.doc[s.i] {
		case close:
			s.i++
			return nil
		case ',':
			s.i++
		default:
			return s.errorf("after value")
		}
	}
}

// str scans a string starting at its quote, and says whether it has
// escapes.
func (s *scanner) str() (escaped bool, err error) {
	if s.i >= len(s.doc) || s.doc[s.i] != '"' {
		return false, s.errorf("looking for beginning of object key string")
	}
	s.i++
	for {
		j := s.i
		for j < len(s.doc) && s.doc[j] != '"' && s.doc[j] != '\\' && s.doc[j] >= 0x20 {
			j++
		}
		s.i = j
		if j >= len(s.doc) {
			return false, errors.New("unexpected end of JSON input")
		}
		switch c := s.doc[j]; {
		case c == '"':
			s.i++
			return escaped, nil
		case c < 0x20:
			return false, s.errorf("in string literal")
		}
		escaped = true
		s.i++ // the backslash
		if s.i >= len(s.doc) {
			return false, errors.New("unexpected end of JSON input")
		}
		switch s.doc[s.i] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.i++
		case 'u':
			s.i++
			for range 4 {
				if s.i >= len(s.doc) {
					return false, errors.New("unexpected end of JSON input")
				}
				if !isHex(s.doc[s.i]) {
					return false, s.errorf("in \\u hexadecimal character escape")
				}
				s.i++
			}
		default:
			return false, s.errorf("in string escape code")
		}
	}
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.doc) && s.doc[s.i] >= '0' && s.doc[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() error {
	if s.doc[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.doc) && s.doc[s.i] == '0':
		s.i++
	case s.digits() == 0:
		return s.errorf("in numeric literal")
	}
	if s.i < len(s.doc) && s.doc[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			return s.errorf("after decimal point in numeric literal")
		}
	}
	if s.i < len(s.doc) && (s.doc[s.i] == 'e' || s.doc[s.i] == 'E') {
		s.i++
		if s.i < len(s.doc) && (s.doc[s.i] == '+' || s.doc[s.i] == '-') {
			s.i++
		}
		if s.digits() == 0 {
			return s.errorf("in exponent of numeric literal")
		}
	}
	return nil
}

func (s *scanner) literal(lit string) error {
	if !bytes.HasPrefix(s.doc[s.i:], []byte(lit)) {
		for k := 0; k < len(lit) && s.i < len(s.doc) && s.doc[s.i] == lit[k]; k++ {
			s.i++
		}
		return s.errorf("in literal " + lit)
	}
	s.i += len(lit)
	return nil
}

// tokenIDs reads raw, a valid JSON value, as a list of token ids when it
// is an array of integers in uint32's range written plainly (digits only:
// no sign, fraction or exponent), which is how clients send them. It
// reports false for anything else, which the caller decodes with
// encoding/json: a 12 000-id prompt costs encoding/json about a
// millisecond, this a fraction of that. Where it reports true, the ids
// are those json.Unmarshal into a []uint32 gives (FuzzTokenIDs).
func tokenIDs(raw []byte) ([]uint32, bool) {
	s := scanner{doc: raw}
	// end reports whether the array closes at s.i and nothing follows.
	end := func() bool {
		s.i++
		s.space()
		return s.i == len(raw)
	}
	if s.space(); s.i == len(raw) || raw[s.i] != '[' {
		return nil, false
	}
	s.i++
	// A rough count of the ids for the allocation: one per comma, plus one.
	ids := make([]uint32, 0, bytes.Count(raw[s.i:], []byte{','})+1)
	if s.space(); s.i < len(raw) && raw[s.i] == ']' {
		return ids, end()
	}
	for {
		start := s.i
		n := s.digits()
		if n == 0 || n > 10 || n > 1 && raw[start] == '0' {
			return nil, false
		}
		var v uint64
		for _, c := range raw[start:s.i] {
			v = v*10 + uint64(c-'0')
		}
		if v > math.MaxUint32 {
			return nil, false
		}
		ids = append(ids, uint32(v))
		if s.space(); s.i == len(raw) {
			return nil, false
		}
		switch raw[s.i] {
		case ',':
			s.i++
			s.space()
		case ']':
			return ids, end()
		default: // a fraction, an exponent, ...
			return nil, false
		}
	}
}
