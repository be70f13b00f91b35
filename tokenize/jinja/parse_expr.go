package jinja

// Expressions: jinja2.parser.Parser's expression grammar (precedence climbing from
// conditional expressions down to primaries, then postfix subscripts, calls, filters
// and tests).

func (p *jParser) parseExpression(withCondExpr bool) (jExpr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > jMaxNesting {
		return nil, p.fail("expression nesting too deep")
	}
	if withCondExpr {
		return p.parseCondExpr()
	}
	return p.parseOr()
}

func (p *jParser) parseCondExpr() (jExpr, error) {
	e1, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		p.soft++
		e2, err := p.parseOr()
		if err != nil {
			p.soft--
			return nil, err
		}
		var e3 jExpr
		if p.skipName("else") {
			if e3, err = p.parseCondExpr(); err != nil {
				p.soft--
				return nil, err
			}
		}
		p.soft--
		e1 = &jeCond{test: e2, yes: e1, no: e3}
	}
	return e1, nil
}

func (p *jParser) parseOr() (jExpr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.skipName("or") {
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &jeOr{l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseAnd() (jExpr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.skipName("and") {
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &jeAnd{l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseNot() (jExpr, error) {
	if p.skipName("not") {
		p.depth++
		defer func() { p.depth-- }()
		if p.depth > jMaxNesting {
			return nil, p.fail("expression nesting too deep")
		}
		e, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &jeNot{e: e}, nil
	}
	return p.parseCompare()
}

func (p *jParser) parseCompare() (jExpr, error) {
	e, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var ops []string
	var rest []jExpr
	for {
		t := p.cur()
		op := ""
		switch {
		case t.t == jtOp && (t.s == "==" || t.s == "!=" || t.s == ">" || t.s == ">=" || t.s == "<" || t.s == "<="):
			p.next()
			op = t.s
		case t.t == jtName && t.s == "in":
			p.next()
			op = "in"
		case t.t == jtName && t.s == "not" && p.look().t == jtName && p.look().s == "in":
			p.next()
			p.next()
			op = "notin"
		default:
			if len(ops) == 0 {
				return e, nil
			}
			return &jeCompare{first: e, ops: ops, rest: rest}, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
		rest = append(rest, r)
	}
}

func (p *jParser) parseMath1() (jExpr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().s
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &jeBin{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseConcat() (jExpr, error) {
	e, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	if !p.isOp("~") {
		return e, nil
	}
	args := []jExpr{e}
	for p.skipOp("~") {
		e, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		args = append(args, e)
	}
	return &jeConcat{args: args}, nil
}

func (p *jParser) parseMath2() (jExpr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().s
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &jeBin{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parsePow() (jExpr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.skipOp("**") {
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &jeBin{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *jParser) parseUnary(withFilter bool) (jExpr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > jMaxNesting {
		return nil, p.fail("expression nesting too deep")
	}
	var e jExpr
	var err error
	switch {
	case p.isOp("-"):
		p.next()
		inner, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &jeNeg{e: inner}
	case p.isOp("+"):
		p.next()
		inner, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &jePos{e: inner}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *jParser) parsePrimary() (jExpr, error) {
	t := p.cur()
	switch t.t {
	case jtName:
		p.next()
		switch t.s {
		case "true", "True":
			return &jeConst{v: jvTrue}, nil
		case "false", "False":
			return &jeConst{v: jvFalse}, nil
		case "none", "None":
			return &jeConst{v: jvNone}, nil
		}
		return &jeName{name: t.s}, nil
	case jtString:
		p.next()
		s := t.s
		for p.cur().t == jtString {
			s += p.next().s
		}
		return &jeConst{v: jStrV(s)}, nil
	case jtInt, jtFloat:
		p.next()
		return &jeConst{v: t.v}, nil
	case jtOp:
		switch t.s {
		case "(":
			p.next()
			e, err := p.parseTuple(false, true, nil, true)
			if err != nil {
				return nil, err
			}
			if err := p.expectOp(")"); err != nil {
				return nil, err
			}
			return e, nil
		case "[":
			return p.parseList()
		case "{":
			return p.parseDict()
		}
	}
	return nil, p.fail("unexpected '%s'", t.describe())
}

func (p *jParser) isTupleEnd(extraEnd []string) bool {
	t := p.cur()
	switch t.t {
	case jtVarEnd, jtBlockEnd:
		return true
	case jtOp:
		return t.s == ")"
	case jtName:
		for _, e := range extraEnd {
			if t.s == e {
				return true
			}
		}
	case jtEOF:
		return true
	}
	return false
}

// parseTuple mirrors Parser.parse_tuple.
func (p *jParser) parseTuple(simplified, withCondExpr bool, extraEnd []string, explicitParens bool) (jExpr, error) {
	var items []jExpr
	isTuple := false
	for {
		if len(items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isTupleEnd(extraEnd) {
			break
		}
		var e jExpr
		var err error
		switch {
		case simplified:
			e, err = p.parsePrimary()
		default:
			e, err = p.parseExpression(withCondExpr)
		}
		if err != nil {
			return nil, err
		}
		items = append(items, e)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if !isTuple {
		if len(items) > 0 {
			return items[0], nil
		}
		if !explicitParens {
			return nil, p.fail("Expected an expression, got '%s'", p.cur().describe())
		}
	}
	return &jeTuple{items: items}, nil
}

func (p *jParser) parseList() (jExpr, error) {
	p.next() // [
	l := &jeList{}
	for !p.isOp("]") {
		if len(l.items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isOp("]") {
			break
		}
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		l.items = append(l.items, e)
	}
	p.next()
	return l, nil
}

func (p *jParser) parseDict() (jExpr, error) {
	p.next() // {
	d := &jeDict{}
	for !p.isOp("}") {
		if len(d.keys) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isOp("}") {
			break
		}
		k, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
	}
	p.next()
	return d, nil
}

func (p *jParser) parsePostfix(e jExpr) (jExpr, error) {
	for {
		var err error
		switch {
		case p.isOp(".") || p.isOp("["):
			e, err = p.parseSubscript(e)
		case p.isOp("("):
			e, err = p.parseCall(e)
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *jParser) parseFilterExpr(e jExpr) (jExpr, error) {
	for {
		var err error
		switch {
		case p.isOp("|"):
			e, err = p.parseFilter(e, false)
		case p.isName("is"):
			e, err = p.parseTest(e)
		case p.isOp("("):
			e, err = p.parseCall(e)
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *jParser) parseSubscript(e jExpr) (jExpr, error) {
	t := p.next()
	if t.s == "." {
		a := p.cur()
		p.next()
		switch a.t {
		case jtName:
			return &jeGetattr{obj: e, name: a.s}, nil
		case jtInt:
			return &jeGetitem{obj: e, key: &jeConst{v: a.v}}, nil
		}
		return nil, p.fail("expected name or number")
	}
	// [
	var args []jExpr
	for !p.isOp("]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		a, err := p.parseSubscribed()
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	p.next()
	switch len(args) {
	case 0:
		return nil, p.fail("expected subscript expression")
	case 1:
		return &jeGetitem{obj: e, key: args[0]}, nil
	}
	return &jeGetitem{obj: e, key: &jeTuple{items: args}}, nil
}

func (p *jParser) parseSubscribed() (jExpr, error) {
	var args []jExpr
	if p.isOp(":") {
		p.next()
		args = []jExpr{nil}
	} else {
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if !p.isOp(":") {
			return e, nil
		}
		p.next()
		args = []jExpr{e}
	}
	switch {
	case p.isOp(":"):
		args = append(args, nil)
	case !p.isOp("]") && !p.isOp(","):
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		args = append(args, e)
	default:
		args = append(args, nil)
	}
	if p.skipOp(":") {
		if !p.isOp("]") && !p.isOp(",") {
			e, err := p.parseExpression(true)
			if err != nil {
				return nil, err
			}
			args = append(args, e)
		} else {
			args = append(args, nil)
		}
	} else {
		args = append(args, nil)
	}
	return &jeSlice{start: args[0], stop: args[1], step: args[2]}, nil
}

func (p *jParser) parseCallArgs() (jArgs, error) {
	var a jArgs
	if err := p.expectOp("("); err != nil {
		return a, err
	}
	requireComma := false
	for !p.isOp(")") {
		if requireComma {
			if err := p.expectOp(","); err != nil {
				return a, err
			}
			if p.isOp(")") {
				break
			}
		}
		switch {
		case p.isOp("*"):
			if a.dynArgs != nil || a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.dynArgs = e
		case p.isOp("**"):
			if a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.dynKw = e
		case p.cur().t == jtName && p.look().t == jtOp && p.look().s == "=":
			if a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			key := p.next().s
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.kwNames = append(a.kwNames, key)
			a.kwVals = append(a.kwVals, e)
		default:
			if a.dynArgs != nil || a.dynKw != nil || len(a.kwNames) > 0 {
				return a, p.fail("invalid syntax for function call expression")
			}
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.pos = append(a.pos, e)
		}
		requireComma = true
	}
	p.next()
	return a, nil
}

func (p *jParser) parseCall(e jExpr) (jExpr, error) {
	args, err := p.parseCallArgs()
	if err != nil {
		return nil, err
	}
	return &jeCall{fn: e, args: args}, nil
}

// parseFilter parses "| name(args) | ..." (startInline: the first "|" is absent).
func (p *jParser) parseFilter(e jExpr, startInline bool) (jExpr, error) {
	for p.isOp("|") || startInline {
		if !startInline {
			p.next()
		}
		startInline = false
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		for p.skipOp(".") {
			n, err := p.expectName()
			if err != nil {
				return nil, err
			}
			name += "." + n
		}
		var args jArgs
		if p.isOp("(") {
			if args, err = p.parseCallArgs(); err != nil {
				return nil, err
			}
		}
		fn := jFilters[name]
		if fn == nil && p.soft == 0 {
			return nil, p.fail("No filter named '%s'.", name)
		}
		e = &jeFilter{e: e, name: name, fn: fn, args: args}
	}
	return e, nil
}

func (p *jParser) parseTest(e jExpr) (jExpr, error) {
	p.next() // is
	negated := p.skipName("not")
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.skipOp(".") {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	var args jArgs
	t := p.cur()
	switch {
	case p.isOp("("):
		if args, err = p.parseCallArgs(); err != nil {
			return nil, err
		}
	case (t.t == jtName || t.t == jtString || t.t == jtInt || t.t == jtFloat || (t.t == jtOp && (t.s == "(" || t.s == "[" || t.s == "{"))) &&
		!(t.t == jtName && (t.s == "else" || t.s == "or" || t.s == "and")):
		if t.t == jtName && t.s == "is" {
			return nil, p.fail("You cannot chain multiple tests with is")
		}
		a, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if a, err = p.parsePostfix(a); err != nil {
			return nil, err
		}
		args.pos = []jExpr{a}
	}
	fn := jTests[name]
	if fn == nil && p.soft == 0 {
		return nil, p.fail("No test named '%s'.", name)
	}
	var out jExpr = &jeTest{e: e, name: name, fn: fn, args: args}
	if negated {
		out = &jeNot{e: out}
	}
	return out, nil
}
