// Gencorpus writes bench/tokenize/testdata/corpus.txt.gz, the corpus of
// bench/tokenize. Run it from the repository root:
//
//	go run ./bench/tokenize/gencorpus
//
// Everything in the corpus is kvgate's own text, so it carries no third-party
// license: Markdown prose of the repository (README.md, BENCHMARKS.md,
// deploy/README.md, data/README.md), the same Markdown rendered as HTML, Go
// sources of kvgate (indexer, scheduler), its YAML, Dockerfiles,
// Makefile, shell and JavaScript, the golden texts of the tokenize package's tests
// (edge cases: whitespace runs, emoji, scripts, special-token look-alikes), and
// French, Japanese, Chinese and Korean sentences written for this corpus (below),
// arranged into paragraphs by a seeded shuffle.
//
// The output depends on the repository's files when it runs, so regenerating it
// changes the corpus: benchmark figures from before and after are not comparable.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"html"
	"io/fs"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

const root = "."

func main() {
	var out bytes.Buffer
	section := func(name, text string) {
		fmt.Fprintf(&out, "%s%s\n", sectionMarker, name)
		out.WriteString(text)
		if !strings.HasSuffix(text, "\n") {
			out.WriteByte('\n')
		}
		log.Printf("%-8s %7d bytes", name, len(text))
	}

	docs := []string{"README.md", "BENCHMARKS.md", "deploy/README.md", "data/README.md"}
	var prose, htm strings.Builder
	for _, f := range docs {
		md := read(f)
		prose.WriteString(md)
		prose.WriteString("\n")
		if f != "BENCHMARKS.md" { // its tables are numbers mostly: the rest is enough HTML
			htm.WriteString(renderHTML(f, md))
		}
	}
	section("markdown", prose.String())
	section("html", htm.String())

	var code strings.Builder
	for _, dir := range []string{"indexer", "scheduler"} {
		for _, f := range files(dir, func(p string) bool {
			return strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") && !strings.Contains(p, "/testdata/")
		}) {
			code.WriteString(read(f))
		}
	}
	section("go", code.String())

	var conf strings.Builder
	for _, f := range append(files("deploy", func(p string) bool {
		base := filepath.Base(p)
		return strings.HasSuffix(p, ".yaml") || strings.HasPrefix(base, "Dockerfile")
	}), "Makefile", ".ci/fuzz", "bench/tokenize/ref.js", "tokenize/testdata/golden/gen.js") {
		conf.WriteString(read(f))
	}
	section("config", conf.String())

	var golden []string
	if err := json.Unmarshal([]byte(read("tokenize/testdata/golden/texts.json")), &golden); err != nil {
		log.Fatal(err)
	}
	var g strings.Builder
	for _, t := range golden {
		if t == "" || strings.ContainsRune(t, 0) {
			continue // documents are JSON strings for the reference: keep them plain
		}
		g.WriteString(t)
		g.WriteString("\n\n")
	}
	section("edge", g.String())

	rng := rand.New(rand.NewPCG(2025, 1))
	section("french", paragraphs(rng, french, " ", 24<<10))
	section("japanese", paragraphs(rng, japanese, "", 24<<10))
	section("chinese", paragraphs(rng, chinese, "", 24<<10))
	section("korean", paragraphs(rng, korean, " ", 24<<10))

	if n := strings.Count(out.String(), sectionMarker); n != 9 {
		log.Fatalf("the section marker occurs %d times, want 9", n)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	zw.Write(out.Bytes())
	if err := zw.Close(); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("bench/tokenize/testdata/corpus.txt.gz", gz.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("bench/tokenize/testdata/corpus.txt.gz: %d bytes, %d gzipped", out.Len(), gz.Len())
}

// sectionMarker starts a line naming the section that follows (as main.go reads it).
const sectionMarker = "\x1ekvgate-corpus "

func read(rel string) string {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		log.Fatal(err)
	}
	if bytes.Contains(b, []byte(sectionMarker)) {
		log.Fatalf("%s contains the section marker", rel)
	}
	return string(b)
}

// files lists the files under dir (relative to the repository root) that keep
// accepts, sorted.
func files(dir string, keep func(string) bool) []string {
	var out []string
	err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if !d.IsDir() && keep(filepath.ToSlash(rel)) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// paragraphs arranges sentences into paragraphs of 3 to 7 sentences, joined by
// sep, up to size bytes, each sentence used once per round in a shuffled order.
func paragraphs(rng *rand.Rand, sentences []string, sep string, size int) string {
	var b strings.Builder
	var order []int
	for b.Len() < size {
		n := 3 + rng.IntN(5)
		for i := range n {
			if len(order) == 0 {
				order = rng.Perm(len(sentences))
			}
			if i > 0 {
				b.WriteString(sep)
			}
			b.WriteString(sentences[order[0]])
			order = order[1:]
		}
		b.WriteString("\n\n")
	}
	return b.String()
}

var (
	inlineCode = regexp.MustCompile("`([^`]+)`")
	strong     = regexp.MustCompile(`\*\*([^*]+)\*\*`)
	link       = regexp.MustCompile(`\[([^\]]+)\]\(([^)]+)\)`)
)

// inline renders a line of Markdown text: escaped, with code, bold and links.
func inline(s string) string {
	s = html.EscapeString(s)
	s = inlineCode.ReplaceAllString(s, "<code>$1</code>")
	s = strong.ReplaceAllString(s, "<strong>$1</strong>")
	return link.ReplaceAllString(s, `<a href="$2">$1</a>`)
}

// renderHTML renders the Markdown that kvgate's documents use (headings,
// paragraphs, lists, tables, fenced and indented code) as an HTML page.
func renderHTML(name, md string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>%s</title>\n</head>\n<body>\n", html.EscapeString(name))
	lines := strings.Split(md, "\n")
	var para []string
	flush := func() {
		if len(para) > 0 {
			fmt.Fprintf(&b, "<p>%s</p>\n", inline(strings.Join(para, "\n")))
			para = nil
		}
	}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "```"):
			flush()
			lang := strings.TrimPrefix(l, "```")
			var code []string
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				code = append(code, lines[i])
			}
			fmt.Fprintf(&b, "<pre><code class=\"language-%s\">%s\n</code></pre>\n", html.EscapeString(lang), html.EscapeString(strings.Join(code, "\n")))
		case strings.HasPrefix(l, "    ") && len(para) == 0:
			var code []string
			for ; i < len(lines) && (strings.HasPrefix(lines[i], "    ") || lines[i] == ""); i++ {
				code = append(code, strings.TrimPrefix(lines[i], "    "))
			}
			i--
			fmt.Fprintf(&b, "<pre><code>%s</code></pre>\n", html.EscapeString(strings.TrimRight(strings.Join(code, "\n"), "\n")))
		case strings.HasPrefix(l, "#"):
			flush()
			level := len(l) - len(strings.TrimLeft(l, "#"))
			text := strings.TrimSpace(l[level:])
			id := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(text), "-"), "-")
			fmt.Fprintf(&b, "<h%d id=\"%s\">%s</h%d>\n", level, id, inline(text), level)
		case strings.HasPrefix(l, "|"):
			flush()
			b.WriteString("<table>\n")
			for row := 0; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
				cells := strings.Split(strings.Trim(lines[i], "|"), "|")
				if strings.Trim(lines[i], "|-: ") == "" {
					continue // the alignment row
				}
				tag := "td"
				if row == 0 {
					tag = "th"
				}
				b.WriteString("  <tr>")
				for _, c := range cells {
					fmt.Fprintf(&b, "<%s>%s</%s>", tag, inline(strings.TrimSpace(c)), tag)
				}
				b.WriteString("</tr>\n")
				row++
			}
			i--
			b.WriteString("</table>\n")
		case strings.HasPrefix(l, "- ") || strings.HasPrefix(l, "* "):
			flush()
			b.WriteString("<ul>\n")
			for ; i < len(lines) && (strings.HasPrefix(lines[i], "- ") || strings.HasPrefix(lines[i], "* ") || strings.HasPrefix(lines[i], "  ")); i++ {
				if strings.HasPrefix(lines[i], "  ") {
					fmt.Fprintf(&b, "    %s\n", inline(strings.TrimSpace(lines[i])))
					continue
				}
				fmt.Fprintf(&b, "  <li>%s\n", inline(lines[i][2:]))
			}
			i--
			b.WriteString("</ul>\n")
		case strings.TrimSpace(l) == "":
			flush()
		default:
			para = append(para, l)
		}
	}
	flush()
	b.WriteString("</body>\n</html>\n")
	return b.String()
}

// The sentences below were written for this corpus.

var french = []string{
	"Le routeur lit chaque requête, calcule les empreintes des blocs du préfixe et choisit le serveur qui en garde déjà le plus en mémoire.",
	"Quand deux serveurs se valent, il préfère celui dont la file d'attente est la plus courte.",
	"Ce matin, il pleuvait sur la ville ; les cafés de la place étaient pleins et l'on entendait le bruit des tasses.",
	"Élodie a préparé une tarte aux pommes, légère et dorée, qu'elle a partagée avec ses voisins du troisième étage.",
	"À la gare, le train de 8 h 15 est parti avec douze minutes de retard, ce qui n'a surpris personne.",
	"Les bibliothèques municipales prêtent désormais des outils, des jeux de société et même des graines pour le jardin.",
	"« Où as-tu rangé les clés ? » demanda-t-il, alors qu'elles étaient posées, bien en vue, sur la table de la cuisine.",
	"Le cache garde les blocs les plus récents ; lorsqu'il est plein, il évince d'abord ceux de la fin des séquences.",
	"Nous avons mesuré la latence au 99e centile : 3,2 ms à 400 requêtes par seconde, et 7,9 ms à 1 200.",
	"L'hiver dernier, le lac a gelé pendant près de trois semaines, et les enfants y ont patiné chaque après-midi.",
	"Il faut compter environ 1,3 jeton par mot en anglais, mais davantage en français, à cause des accents et des apostrophes.",
	"Chaque été, le festival accueille des musiciens venus d'Afrique de l'Ouest, du Québec et de Bretagne.",
	"Le boulanger du coin ouvre à six heures ; à sept heures, il ne reste souvent plus une seule baguette.",
	"Pour reproduire le résultat, lancez la commande deux fois et comparez les identifiants obtenus.",
	"Ses grands-parents habitaient une maison aux volets bleus, au bout d'un chemin bordé de châtaigniers.",
	"La réunion a été reportée à jeudi, faute de salle disponible ; l'ordre du jour reste inchangé.",
	"Ce n'est qu'après plusieurs essais que l'équipe a compris pourquoi le serveur répondait si lentement.",
	"Les œufs, la crème fraîche et un peu de noix de muscade suffisent pour une quiche réussie.",
	"Le musée expose cette année des cartes marines du XVIIIe siècle, dessinées à la main et coloriées à l'aquarelle.",
	"Au-delà de ce seuil, le système refuse les nouvelles requêtes plutôt que de laisser la file s'allonger indéfiniment.",
	"Aujourd'hui, la température ne dépassera pas 12 °C ; prévoyez un manteau et, pourquoi pas, un parapluie.",
	"Les étudiants ont rendu leurs mémoires en retard, mais le jury s'est montré compréhensif.",
	"Une fois le modèle chargé, chaque invite est découpée en jetons, puis en blocs de seize jetons.",
	"Il était une fois, dans un village perché sur une colline, une horlogère qui réparait les montres de tout le canton.",
}

var japanese = []string{
	"ルーターは各リクエストのプロンプトをブロックに分け、そのハッシュを計算して、最も多くのブロックをすでにキャッシュしているサーバーを選びます。",
	"二つのサーバーが同じ程度なら、待ち行列の短いほうを優先します。",
	"今朝は雨が降っていて、駅前の喫茶店はどこも満席でした。",
	"祖母は毎年秋になると、庭で採れた柿を干して、親戚に送ってくれます。",
	"新しい図書館は午前九時に開館し、午後八時まで利用できます。",
	"「鍵はどこに置いたの？」と聞くと、彼は台所のテーブルを指さした。",
	"キャッシュが満杯になると、シーケンスの末尾にあるブロックから先に追い出されます。",
	"400リクエスト毎秒での99パーセンタイルのレイテンシは3.2ミリ秒でした。",
	"冬の北海道では、雪まつりを見に多くの観光客が訪れます。",
	"この結果を再現するには、同じコマンドを二回実行して、出力されたIDを比べてください。",
	"週末には友人と山に登り、頂上でおにぎりを食べました。",
	"会議は木曜日に延期されましたが、議題は変わりません。",
	"何度か試したあとで、チームはようやくサーバーの応答が遅い理由に気づきました。",
	"桜の季節になると、川沿いの道は花見をする人々でにぎわいます。",
	"しきい値を超えると、システムは待ち行列を伸ばし続けるのではなく、新しいリクエストを断ります。",
	"東京から大阪までは新幹線で約二時間半かかります。",
	"彼女は毎朝五時に起きて、ジョギングをしてから仕事に出かけます。",
	"古い地図を眺めていると、町の形が少しずつ変わってきたことがわかります。",
	"モデルを読み込んだあと、プロンプトはトークンに分割され、さらに16トークンずつのブロックにまとめられます。",
	"今日の最高気温は12度の予報なので、上着を持って出かけたほうがよさそうです。",
}

var chinese = []string{
	"路由器把每个请求的提示词切分成块，计算每块的哈希值，然后选择已经缓存了最多块的服务器。",
	"如果两台服务器不相上下，它会优先选择排队较短的那一台。",
	"今天早上下着小雨，车站附近的咖啡馆里坐满了人。",
	"奶奶每年秋天都会把院子里的柿子晒干，寄给远方的亲戚。",
	"新图书馆每天上午九点开门，晚上八点关门，周一休息。",
	"“钥匙放在哪儿了？”他问道，其实钥匙就在厨房的桌子上。",
	"缓存满了以后，会先淘汰序列末尾的块。",
	"在每秒400个请求的负载下，第99百分位的延迟是3.2毫秒。",
	"冬天的哈尔滨冰雪节吸引了许多来自南方的游客。",
	"要复现这个结果，请把同一条命令运行两次，并比较输出的编号。",
	"周末我们去爬山，在山顶上吃了自己带的饺子和水果。",
	"会议推迟到了星期四，但议程没有变化。",
	"试了好几次之后，团队才弄明白服务器为什么响应得这么慢。",
	"春天到了，河边的小路上挤满了赏花的人。",
	"超过这个阈值，系统就会拒绝新的请求，而不是让队列无限地变长。",
	"从北京到上海坐高铁大约需要四个半小时。",
	"她每天早上六点起床，先跑步，再去上班。",
	"看着这张老地图，可以发现城市的样子一点一点地改变了。",
	"這家老茶館已經開了六十多年，牆上還掛著當年的照片。",
	"學生們在圖書館裡安靜地讀書，窗外的樹葉隨風搖動。",
}

var korean = []string{
	"라우터는 각 요청의 프롬프트를 블록으로 나누고 해시를 계산한 뒤, 그 블록을 가장 많이 캐시하고 있는 서버를 고릅니다.",
	"두 서버가 비슷하면 대기열이 더 짧은 쪽을 택합니다.",
	"오늘 아침에는 비가 와서 역 앞 카페마다 사람이 가득했습니다.",
	"할머니는 해마다 가을이면 마당에서 딴 감을 말려 친척들에게 보내 주십니다.",
	"새 도서관은 오전 아홉 시에 문을 열고 오후 여덟 시에 닫습니다.",
	"\"열쇠 어디에 뒀어?\" 하고 묻자, 그는 부엌 식탁을 가리켰다.",
	"캐시가 가득 차면 시퀀스 끝에 있는 블록부터 먼저 내보냅니다.",
	"초당 400건의 요청에서 99번째 백분위 지연 시간은 3.2밀리초였습니다.",
	"주말에는 친구들과 산에 올라 정상에서 김밥을 먹었습니다.",
	"회의는 목요일로 미뤄졌지만 안건은 그대로입니다.",
	"몇 번을 시도한 끝에 팀은 서버가 느리게 응답하는 이유를 알아냈습니다.",
	"이 결과를 재현하려면 같은 명령을 두 번 실행하고 출력된 ID를 비교하세요.",
	"봄이 오면 강변 길은 벚꽃을 보러 나온 사람들로 붐빕니다.",
	"서울에서 부산까지는 고속열차로 약 두 시간 반이 걸립니다.",
	"그녀는 매일 아침 다섯 시에 일어나 달리기를 한 뒤 출근합니다.",
	"이 임계값을 넘으면 시스템은 대기열을 계속 늘리는 대신 새 요청을 거절합니다.",
}
