package jinja

// Lexer: jinja2.lexer.Lexer for the environment transformers builds (default
// delimiters, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, no line
// statements), including the whitespace-control rules ("-" strips all whitespace, "+"
// disables lstrip/trim).

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

type tokenType uint8

const (
	tokEOF tokenType = iota
	tokData
	tokVarBegin
	tokVarEnd
	tokBlockBegin
	tokBlockEnd
	tokName
	tokString
	tokInt
	tokFloat
	tokOp
)

type token struct {
	t    tokenType
	s    string // data text, name, decoded string literal or operator
	v    Value  // value of an integer or float literal
	line int
}

func (t token) describe() string {
	switch t.t {
	case tokEOF:
		return "end of template"
	case tokData:
		return "template data"
	case tokVarBegin:
		return "begin of print statement"
	case tokVarEnd:
		return "end of print statement"
	case tokBlockBegin:
		return "begin of statement block"
	case tokBlockEnd:
		return "end of statement block"
	case tokString:
		return "string"
	case tokInt:
		return "integer"
	case tokFloat:
		return "float"
	}
	return t.s
}

// syntaxError is a template that does not parse (jinja2.TemplateSyntaxError).
type syntaxError struct {
	msg  string
	line int
}

func (e *syntaxError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

type lexer struct {
	src     string
	pos     int
	line    int
	toks    []token
	balance []byte
}

// normalizeSource applies jinja2's newline handling: \r\n and \r become \n and, since
// keep_trailing_newline is off, one trailing newline is dropped.
func normalizeSource(src string) string {
	if strings.IndexByte(src, '\r') >= 0 {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	return strings.TrimSuffix(src, "\n")
}

func lex(src string) ([]token, error) {
	lx := &lexer{src: normalizeSource(src), line: 1}
	if err := lx.run(); err != nil {
		return nil, err
	}
	return lx.toks, nil
}

func (lx *lexer) errorf(format string, args ...any) error {
	return &syntaxError{msg: fmt.Sprintf(format, args...), line: lx.line}
}

func (lx *lexer) emit(t tokenType, s string) {
	lx.toks = append(lx.toks, token{t: t, s: s, line: lx.line})
}

func (lx *lexer) emitData(s string) {
	if s != "" {
		lx.toks = append(lx.toks, token{t: tokData, s: s, line: lx.line})
	}
	lx.line += strings.Count(s, "\n")
}

// advance moves pos to p, counting newlines.
func (lx *lexer) advance(p int) {
	lx.line += strings.Count(lx.src[lx.pos:p], "\n")
	lx.pos = p
}

func (lx *lexer) run() error {
	src := lx.src
	lineStarting := true
	for lx.pos < len(src) {
		// root state: text up to the next tag start
		start := -1
		var kind byte
		for i := lx.pos; i+1 < len(src); i++ {
			if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
				start, kind = i, src[i+1]
				break
			}
		}
		if start < 0 {
			lx.emitData(src[lx.pos:])
			lx.pos = len(src)
			break
		}
		text := src[lx.pos:start]
		sign := byte(0)
		if start+2 < len(src) && (src[start+2] == '-' || src[start+2] == '+') {
			sign = src[start+2]
		}
		rawEnd := -1
		if kind == '%' {
			rawEnd = lx.matchRawBegin(start)
		}
		// whitespace control of the text before the tag
		switch {
		case sign == '-':
			text = pyRStrip(text)
		case sign != '+' && kind != '{':
			lpos := strings.LastIndexByte(text, '\n') + 1
			if lpos > 0 || lineStarting {
				only := true
				for i := lpos; i < len(text); i++ {
					if text[i] != ' ' && text[i] != '\t' {
						only = false
						break
					}
				}
				if only {
					text = text[:lpos]
				}
			}
		}
		lx.emitData(text)
		lx.line += strings.Count(src[lx.pos+len(text):start], "\n")
		lx.pos = start
		var err error
		switch {
		case rawEnd >= 0:
			lineStarting, err = lx.lexRaw(rawEnd)
		case kind == '#':
			lineStarting, err = lx.lexComment(start + 2 + boolInt(sign != 0))
		case kind == '{':
			lx.pos = start + 2 + boolInt(sign != 0)
			lx.emit(tokVarBegin, "")
			lineStarting, err = lx.lexExpr(false)
		default:
			lx.pos = start + 2 + boolInt(sign != 0)
			lx.emit(tokBlockBegin, "")
			lineStarting, err = lx.lexExpr(true)
		}
		if err != nil {
			return err
		}
	}
	lx.toks = append(lx.toks, token{t: tokEOF, line: lx.line})
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// skipSpace returns the index after the Python-\s* run at i.
func (lx *lexer) skipSpace(i int) int {
	for i < len(lx.src) {
		r, size := utf8.DecodeRuneInString(lx.src[i:])
		if !pyIsSpace(r) {
			break
		}
		i += size
	}
	return i
}

// matchRawBegin matches {%[-+]?\s*raw\s*(-%}\s*|%}) at start and returns the end of
// the match, or -1.
func (lx *lexer) matchRawBegin(start int) int {
	src := lx.src
	i := start + 2
	if i < len(src) && (src[i] == '-' || src[i] == '+') {
		i++
	}
	i = lx.skipSpace(i)
	if !strings.HasPrefix(src[i:], "raw") {
		return -1
	}
	i = lx.skipSpace(i + 3)
	switch {
	case strings.HasPrefix(src[i:], "-%}"):
		return lx.skipSpace(i + 3)
	case strings.HasPrefix(src[i:], "%}"):
		return i + 2
	}
	return -1
}

// lexRaw handles {% raw %}...{% endraw %}, starting after the raw begin tag.
func (lx *lexer) lexRaw(from int) (bool, error) {
	src := lx.src
	lx.advance(from)
	for i := from; i+1 < len(src); i++ {
		if src[i] != '{' || src[i+1] != '%' {
			continue
		}
		j := i + 2
		sign := byte(0)
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			sign = src[j]
			j++
		}
		j = lx.skipSpace(j)
		if !strings.HasPrefix(src[j:], "endraw") {
			continue
		}
		j = lx.skipSpace(j + 6)
		end := -1
		switch {
		case strings.HasPrefix(src[j:], "+%}"):
			end = j + 3
		case strings.HasPrefix(src[j:], "-%}"):
			end = lx.skipSpace(j + 3)
		case strings.HasPrefix(src[j:], "%}"):
			end = j + 2
			if end < len(src) && src[end] == '\n' {
				end++
			}
		}
		if end < 0 {
			continue
		}
		text := src[from:i]
		switch {
		case sign == '-':
			text = pyRStrip(text)
		case sign != '+':
			lpos := strings.LastIndexByte(text, '\n') + 1
			if lpos > 0 {
				only := true
				for k := lpos; k < len(text); k++ {
					if text[k] != ' ' && text[k] != '\t' {
						only = false
						break
					}
				}
				if only {
					text = text[:lpos]
				}
			}
		}
		lx.emitData(text)
		lx.line += strings.Count(src[from+len(text):i], "\n")
		lx.pos = i
		lx.advance(end)
		return strings.HasSuffix(src[i:end], "\n"), nil
	}
	return false, lx.errorf("Missing end of raw directive")
}

// lexComment skips a comment whose text starts at from.
func (lx *lexer) lexComment(from int) (bool, error) {
	src := lx.src
	q := strings.Index(src[from:], "#}")
	if q < 0 {
		return false, lx.errorf("Missing end of comment tag")
	}
	q += from
	end := q + 2
	switch {
	case q-1 >= from && src[q-1] == '+':
	case q-1 >= from && src[q-1] == '-':
		end = lx.skipSpace(end)
	default:
		if end < len(src) && src[end] == '\n' {
			end++
		}
	}
	lx.advance(end)
	return strings.HasSuffix(src[from:end], "\n"), nil
}

// lexExpr lexes the inside of {% %} (block) or {{ }} and the closing delimiter.
func (lx *lexer) lexExpr(block bool) (bool, error) {
	src := lx.src
	for {
		if lx.pos >= len(src) {
			if block {
				return false, lx.errorf("unexpected end of template, expected 'end of statement block'")
			}
			return false, lx.errorf("unexpected end of template, expected 'end of print statement'")
		}
		p := lx.pos
		if len(lx.balance) == 0 {
			if block {
				end := -1
				switch {
				case strings.HasPrefix(src[p:], "+%}"):
					end = p + 3
				case strings.HasPrefix(src[p:], "-%}"):
					end = lx.skipSpace(p + 3)
				case strings.HasPrefix(src[p:], "%}"):
					end = p + 2
					if end < len(src) && src[end] == '\n' {
						end++
					}
				}
				if end >= 0 {
					lx.emit(tokBlockEnd, "")
					lx.advance(end)
					return strings.HasSuffix(src[p:end], "\n"), nil
				}
			} else {
				end := -1
				switch {
				case strings.HasPrefix(src[p:], "-}}"):
					end = lx.skipSpace(p + 3)
				case strings.HasPrefix(src[p:], "}}"):
					end = p + 2
				}
				if end >= 0 {
					lx.emit(tokVarEnd, "")
					lx.advance(end)
					return strings.HasSuffix(src[p:end], "\n"), nil
				}
			}
		}
		c := src[p]
		r, size := utf8.DecodeRuneInString(src[p:])
		switch {
		case pyIsSpace(r):
			lx.advance(lx.skipSpace(p))
		case c >= '0' && c <= '9':
			if err := lx.lexNumber(); err != nil {
				return false, err
			}
		case c == '_' || (c < utf8.RuneSelf && (c|0x20 >= 'a' && c|0x20 <= 'z')) || (c >= utf8.RuneSelf && unicode.IsLetter(r)):
			j := p + size
			for j < len(src) {
				r2, s2 := utf8.DecodeRuneInString(src[j:])
				if r2 == '_' || unicode.IsLetter(r2) || unicode.IsDigit(r2) || unicode.Is(unicode.Mn, r2) || unicode.Is(unicode.Mc, r2) || unicode.Is(unicode.Nd, r2) {
					j += s2
					continue
				}
				break
			}
			lx.emit(tokName, src[p:j])
			lx.pos = j
		case c == '\'' || c == '"':
			if err := lx.lexString(c); err != nil {
				return false, err
			}
		default:
			op := ""
			if p+1 < len(src) {
				switch src[p : p+2] {
				case "//", "**", "==", "!=", ">=", "<=":
					op = src[p : p+2]
				}
			}
			if op == "" && strings.IndexByte("+-/*%~[](){}><=.:|,;", c) >= 0 {
				op = src[p : p+1]
			}
			if op == "" {
				return false, lx.errorf("unexpected char %s at %d", pyQuote(string(r)), p)
			}
			switch op {
			case "(":
				lx.balance = append(lx.balance, ')')
			case "[":
				lx.balance = append(lx.balance, ']')
			case "{":
				lx.balance = append(lx.balance, '}')
			case ")", "]", "}":
				if len(lx.balance) == 0 {
					return false, lx.errorf("unexpected '%s'", op)
				}
				want := lx.balance[len(lx.balance)-1]
				lx.balance = lx.balance[:len(lx.balance)-1]
				if want != op[0] {
					return false, lx.errorf("unexpected '%s', expected '%c'", op, want)
				}
			}
			lx.emit(tokOp, op)
			lx.pos = p + len(op)
		}
	}
}

func isDigitBase(c byte, base int) bool {
	switch base {
	case 2:
		return c == '0' || c == '1'
	case 8:
		return c >= '0' && c <= '7'
	case 16:
		return (c >= '0' && c <= '9') || (c|0x20 >= 'a' && c|0x20 <= 'f')
	}
	return c >= '0' && c <= '9'
}

// scanDigits matches (\d+_)*\d+ (or the (_?d)* tail when leadingDigit is false) at i
// and returns the end, or i when nothing matched.
func (lx *lexer) scanDigitRun(i int) int {
	src := lx.src
	j := i
	for j < len(src) && src[j] >= '0' && src[j] <= '9' {
		j++
		if j+1 < len(src) && src[j] == '_' && src[j+1] >= '0' && src[j+1] <= '9' {
			j++
		}
	}
	return j
}

func (lx *lexer) lexNumber() error {
	src := lx.src
	p := lx.pos
	// float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)
	if p == 0 || src[p-1] != '.' {
		j := lx.scanDigitRun(p)
		k := j
		frac := false
		if k < len(src) && src[k] == '.' {
			if e := lx.scanDigitRun(k + 1); e > k+1 {
				k, frac = e, true
			}
		}
		exp := k
		if exp < len(src) && (src[exp] == 'e' || src[exp] == 'E') {
			e := exp + 1
			if e < len(src) && (src[e] == '+' || src[e] == '-') {
				e++
			}
			if f := lx.scanDigitRun(e); f > e {
				exp = f
			} else {
				exp = k
			}
		}
		end := -1
		switch {
		case exp > k:
			end = exp
		case frac:
			end = k
		}
		if end > 0 {
			text := strings.ReplaceAll(src[p:end], "_", "")
			f, err := parseFloat(text)
			if err != nil {
				return lx.errorf("invalid float literal %s", text)
			}
			lx.toks = append(lx.toks, token{t: tokFloat, s: src[p:end], v: floatValue(f), line: lx.line})
			lx.pos = end
			return nil
		}
	}
	// integer: 0b.., 0o.., 0x.., [1-9](_?\d)*, 0(_?0)*
	base := 10
	j := p
	if src[p] == '0' && p+1 < len(src) {
		switch src[p+1] | 0x20 {
		case 'b':
			base = 2
		case 'o':
			base = 8
		case 'x':
			base = 16
		}
	}
	if base != 10 {
		k := p + 2
		for k < len(src) {
			if src[k] == '_' && k+1 < len(src) && isDigitBase(src[k+1], base) {
				k += 2
				continue
			}
			if isDigitBase(src[k], base) {
				k++
				continue
			}
			break
		}
		if k > p+2 {
			j = k
		} else {
			base = 10
		}
	}
	if base == 10 {
		if src[p] == '0' {
			j = p + 1
			for j < len(src) {
				if src[j] == '0' {
					j++
				} else if src[j] == '_' && j+1 < len(src) && src[j+1] == '0' {
					j += 2
				} else {
					break
				}
			}
		} else {
			j = lx.scanDigitRun(p)
		}
	}
	text := strings.ReplaceAll(src[p:j], "_", "")
	digits := text
	if base != 10 {
		digits = text[2:]
	}
	v, ok := parseIntBase(digits, base)
	if !ok {
		return lx.errorf("invalid integer literal %s", text)
	}
	lx.toks = append(lx.toks, token{t: tokInt, s: src[p:j], v: v, line: lx.line})
	lx.pos = j
	return nil
}

func (lx *lexer) lexString(q byte) error {
	src := lx.src
	p := lx.pos
	i := p + 1
	for i < len(src) {
		switch src[i] {
		case '\\':
			i += 2
			continue
		case q:
			raw := src[p+1 : i]
			val, err := unescapeString(raw)
			if err != nil {
				return lx.errorf("%s", err.Error())
			}
			lx.toks = append(lx.toks, token{t: tokString, s: val, line: lx.line})
			lx.advance(i + 1)
			return nil
		}
		i++
	}
	return lx.errorf("unexpected char %s at %d", pyQuote(string(q)), p)
}

// unescapeString reproduces value.encode("ascii", "backslashreplace").decode(
// "unicode-escape"), which is how jinja2 decodes string literals.
func unescapeString(raw string) (string, error) {
	if strings.IndexByte(raw, '\\') < 0 {
		return raw, nil
	}
	// backslashreplace: non-ASCII characters become \xNN, \uNNNN or \UNNNNNNNN
	var ascii strings.Builder
	for _, r := range raw {
		switch {
		case r < 0x80:
			ascii.WriteRune(r)
		case r < 0x100:
			ascii.WriteString(`\x` + hex(uint32(r), 2))
		case r < 0x10000:
			ascii.WriteString(`\u` + hex(uint32(r), 4))
		default:
			ascii.WriteString(`\U` + hex(uint32(r), 8))
		}
	}
	s := ascii.String()
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			out.WriteByte(c)
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("\\ at end of string")
		}
		i++
		switch c = s[i]; c {
		case '\n':
		case '\\', '\'', '"':
			out.WriteByte(c)
		case 'a':
			out.WriteByte(7)
		case 'b':
			out.WriteByte(8)
		case 'f':
			out.WriteByte(12)
		case 'n':
			out.WriteByte('\n')
		case 'r':
			out.WriteByte('\r')
		case 't':
			out.WriteByte('\t')
		case 'v':
			out.WriteByte(11)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := rune(c - '0')
			for k := 0; k < 2 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '7'; k++ {
				i++
				v = v*8 + rune(s[i]-'0')
			}
			out.WriteRune(v)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
			var v rune
			for k := 1; k <= n; k++ {
				if i+k >= len(s) || !isDigitBase(s[i+k], 16) {
					return "", fmt.Errorf("truncated \\%c escape", c)
				}
				d := s[i+k]
				switch {
				case d >= '0' && d <= '9':
					v = v*16 + rune(d-'0')
				default:
					v = v*16 + rune(d|0x20-'a'+10)
				}
			}
			if v > unicode.MaxRune {
				return "", fmt.Errorf("illegal Unicode character")
			}
			i += n
			out.WriteRune(v)
		case 'N':
			return "", fmt.Errorf("\\N{...} escapes are not supported")
		default:
			out.WriteByte('\\')
			out.WriteByte(c)
		}
	}
	return out.String(), nil
}
