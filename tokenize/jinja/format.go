package jinja

// str.format and format specifications (PEP 3101), as CPython implements them.

import (
	"math"
	"math/big"
	"strconv"
	"strings"
)

// vformat is str.format as jinja2's sandboxed formatter runs it: replacement fields
// with automatic or explicit indexes, keyword names, .attr and [key] lookups (through
// the sandbox), !s/!r conversions and a format spec.
func vformat(e *evaluator, f string, args []Value, kw kwargs) (string, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c == '}' {
			if i+1 < len(f) && f[i+1] == '}' {
				b.WriteByte('}')
				i++
				continue
			}
			return "", errorf("ValueError", "Single '}' encountered in format string")
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(f) && f[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		depth := 1
		j := i + 1
		for ; j < len(f); j++ {
			if f[j] == '{' {
				depth++
			} else if f[j] == '}' {
				depth--
				if depth == 0 {
					break
				}
			}
		}
		if j >= len(f) {
			return "", errorf("ValueError", "expected '}' before end of string")
		}
		field := f[i+1 : j]
		i = j
		spec := ""
		conv := byte(0)
		if k := strings.IndexByte(field, ':'); k >= 0 {
			field, spec = field[:k], field[k+1:]
		}
		if k := strings.IndexByte(field, '!'); k >= 0 {
			if k+2 != len(field) {
				return "", errorf("ValueError", "expected ':' after conversion specifier")
			}
			conv = field[k+1]
			field = field[:k]
		}
		// first name part
		k := 0
		for k < len(field) && field[k] != '.' && field[k] != '[' {
			k++
		}
		head, rest := field[:k], field[k:]
		var v Value
		switch {
		case head == "":
			if auto < 0 {
				return "", errorf("ValueError", "cannot switch from manual field specification to automatic field numbering")
			}
			if auto >= len(args) {
				return "", errorf("IndexError", "Replacement index %d out of range for positional args tuple", auto)
			}
			v = args[auto]
			auto++
		case head[0] >= '0' && head[0] <= '9':
			n, err := strconv.Atoi(head)
			if err != nil {
				return "", errorf("ValueError", "invalid field name %s", head)
			}
			if auto > 0 {
				return "", errorf("ValueError", "cannot switch from automatic field numbering to manual field specification")
			}
			auto = -1
			if n >= len(args) {
				return "", errorf("IndexError", "Replacement index %d out of range for positional args tuple", n)
			}
			v = args[n]
		default:
			x, ok := kw.get(head)
			if !ok {
				return "", errorf("KeyError", "%s", pyQuote(head))
			}
			v = x
		}
		for rest != "" {
			var err error
			if rest[0] == '.' {
				k := 1
				for k < len(rest) && rest[k] != '.' && rest[k] != '[' {
					k++
				}
				if v, err = e.getattr(v, rest[1:k]); err != nil {
					return "", err
				}
				rest = rest[k:]
				continue
			}
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return "", errorf("ValueError", "Missing ']' in format string")
			}
			key := rest[1:end]
			var kv Value = StringValue(key)
			if n, err := strconv.Atoi(key); err == nil {
				kv = intValue(int64(n))
			}
			if v, err = e.getitem(v, kv); err != nil {
				return "", err
			}
			rest = rest[end+1:]
		}
		switch conv {
		case 0, 's':
			if conv == 's' {
				v = StringValue(v.String())
			}
		case 'r', 'a':
			v = StringValue(v.Repr())
		default:
			return "", errorf("ValueError", "Unknown conversion specifier %c", conv)
		}
		if strings.Contains(spec, "{") {
			inner, err := vformat(e, spec, args, kw)
			if err != nil {
				return "", err
			}
			spec = inner
		}
		out, err := formatSpec(v, spec)
		if err != nil {
			return "", err
		}
		b.WriteString(out)
	}
	return b.String(), nil
}

// formatSpec is format(v, spec) for the common spec mini-language.
func formatSpec(v Value, spec string) (string, error) {
	if spec == "" {
		if v.k == KindUndefined {
			return "", nil
		}
		return v.String(), nil
	}
	fill, align := " ", byte(0)
	rs := []rune(spec)
	i := 0
	if len(rs) >= 2 && strings.ContainsRune("<>=^", rs[1]) {
		fill, align = string(rs[0]), byte(rs[1])
		i = 2
	} else if len(rs) >= 1 && strings.ContainsRune("<>=^", rs[0]) {
		align = byte(rs[0])
		i = 1
	}
	rest := string(rs[i:])
	sign := byte(0)
	if rest != "" && strings.IndexByte("+- ", rest[0]) >= 0 {
		sign = rest[0]
		rest = rest[1:]
	}
	alt := false
	if strings.HasPrefix(rest, "#") {
		alt = true
		rest = rest[1:]
	}
	if strings.HasPrefix(rest, "0") && align == 0 {
		fill, align = "0", '='
		rest = rest[1:]
	}
	width := 0
	for rest != "" && rest[0] >= '0' && rest[0] <= '9' {
		width = width*10 + int(rest[0]-'0')
		rest = rest[1:]
	}
	grouping := ""
	if rest != "" && (rest[0] == ',' || rest[0] == '_') {
		grouping = rest[:1]
		rest = rest[1:]
	}
	prec := -1
	if strings.HasPrefix(rest, ".") {
		rest = rest[1:]
		prec = 0
		for rest != "" && rest[0] >= '0' && rest[0] <= '9' {
			prec = prec*10 + int(rest[0]-'0')
			rest = rest[1:]
		}
	}
	typ := byte(0)
	if len(rest) == 1 {
		typ = rest[0]
	} else if rest != "" {
		return "", errorf("ValueError", "Invalid format specifier")
	}
	var body string
	neg := false
	switch {
	case v.k == KindString || (typ == 's'):
		if v.k != KindString {
			return "", errorf("ValueError", "Unknown format code 's' for object of type '%s'", v.TypeName())
		}
		body = v.s
		if prec >= 0 {
			body = truncRunes(body, prec)
		}
		if align == 0 {
			align = '<'
		}
	case v.isNumber():
		if typ == 0 && v.k != KindFloat {
			typ = 'd'
		}
		switch typ {
		case 'd', 'n':
			if v.k == KindFloat {
				return "", errorf("ValueError", "Unknown format code 'd' for object of type 'float'")
			}
			n := bigOf(v)
			if v.k == KindBool {
				n = big.NewInt(v.n)
			}
			neg = n.Sign() < 0
			body = new(big.Int).Abs(n).String()
			if grouping != "" {
				body = groupDigits(body, grouping)
			}
		case 'x', 'X', 'o', 'b':
			if v.k == KindFloat {
				return "", errorf("ValueError", "Unknown format code '%c' for object of type 'float'", typ)
			}
			n := bigOf(v)
			neg = n.Sign() < 0
			base := map[byte]int{'x': 16, 'X': 16, 'o': 8, 'b': 2}[typ]
			body = new(big.Int).Abs(n).Text(base)
			if typ == 'X' {
				body = strings.ToUpper(body)
			}
			if alt {
				body = "0" + string(typ) + body
			}
		case 'f', 'F', 'e', 'E', 'g', 'G', '%', 0:
			f, err := asFloat(v)
			if err != nil {
				return "", err
			}
			neg = math.Signbit(f) && !math.IsNaN(f)
			f = math.Abs(f)
			switch typ {
			case '%':
				if prec < 0 {
					prec = 6
				}
				body = formatFloat(f*100, 'f', prec, alt) + "%"
			case 0:
				if prec < 0 {
					body = floatRepr(f)
				} else {
					body = formatFloat(f, 'g', prec, alt)
				}
			default:
				if prec < 0 {
					prec = 6
				}
				body = formatFloat(f, typ, prec, alt)
			}
			if grouping != "" {
				intPart, frac, _ := strings.Cut(body, ".")
				body = groupDigits(intPart, grouping)
				if frac != "" || strings.Contains(body, ".") {
					body += "." + frac
				}
			}
		default:
			return "", errorf("ValueError", "Unknown format code '%c' for object of type '%s'", typ, v.TypeName())
		}
		if align == 0 {
			align = '>'
		}
	default:
		if typ != 0 {
			return "", errorf("TypeError", "unsupported format string passed to %s.__format__", v.TypeName())
		}
		body = v.String()
		if align == 0 {
			align = '<'
		}
	}
	signStr := ""
	switch {
	case neg:
		signStr = "-"
	case sign == '+':
		signStr = "+"
	case sign == ' ':
		signStr = " "
	}
	total := strLen(signStr) + strLen(body)
	if width <= total {
		return signStr + body, nil
	}
	pad := width - total
	switch align {
	case '<':
		return signStr + body + strings.Repeat(fill, pad), nil
	case '>':
		return strings.Repeat(fill, pad) + signStr + body, nil
	case '=':
		return signStr + strings.Repeat(fill, pad) + body, nil
	}
	left := pad / 2
	return strings.Repeat(fill, left) + signStr + body + strings.Repeat(fill, pad-left), nil
}

func groupDigits(s, sep string) string {
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	first := len(s) % 3
	if first > 0 {
		b.WriteString(s[:first])
	}
	for i := first; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}
