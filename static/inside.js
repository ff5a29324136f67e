// "Open inside" as the seed pages show it: with JavaScript, a card under "Open inside" opens the child's page in a
// panel over its parent, with a close control and a URL of its own (the parent's address with #inside=CHILD, so a
// reload, the back button or a shared link reopens or closes it); without JavaScript the cards are the plain links
// they always were. The panel is a modal <dialog> (focus stays inside it, Escape closes it) holding the child page
// in an <iframe>, which loads from file:// as from a server; a page shown in the panel drops its own site chrome
// (html.embedded in style.css), and its links, cards included, are followed inside the panel.
(function () {
  'use strict';
  const KEY = '#inside=';
  if (window.self !== window.top) {  // shown in a parent's panel: its cards stay links, followed inside the panel
    document.documentElement.classList.add('embedded');
    return;
  }
  const cards = [...document.querySelectorAll('#inside a.card')];
  if (!cards.length || typeof HTMLDialogElement === 'undefined') return;
  const byHref = new Map(cards.map(a => [a.getAttribute('href'), a]));
  let dialog = null, frame = null, heading = null, own = null, opener = null;

  function build() {
    dialog = document.createElement('dialog');
    dialog.className = 'inside-panel';
    dialog.setAttribute('aria-labelledby', 'inside-panel-title');
    const bar = document.createElement('div');
    bar.className = 'inside-bar';
    heading = document.createElement('h2');
    heading.id = 'inside-panel-title';
    own = document.createElement('a');
    own.className = 'inside-own';
    own.textContent = 'Open as its own page';
    const close = document.createElement('button');
    close.type = 'button';
    close.className = 'inside-close';
    close.setAttribute('aria-label', 'Close');
    close.textContent = '×';
    close.addEventListener('click', () => shut(true));
    bar.append(heading, own, close);
    frame = document.createElement('iframe');
    dialog.append(bar, frame);
    dialog.addEventListener('cancel', event => { event.preventDefault(); shut(true); });
    document.body.append(dialog);
  }

  function show(href, push) {
    const card = byHref.get(href);
    if (!card) return false;
    if (!dialog) build();
    const title = card.querySelector('.card-title');
    heading.textContent = title ? title.textContent : href;
    frame.title = heading.textContent;
    own.href = href;
    if (frame.getAttribute('src') !== href) frame.src = href;
    if (push) history.pushState(null, '', KEY + encodeURIComponent(href));
    opener = card;
    if (!dialog.open) dialog.showModal();
    return true;
  }

  function shut(push) {
    if (!dialog || !dialog.open) return;
    dialog.close();
    if (push) history.pushState(null, '', location.pathname + location.search);
    if (opener) opener.focus();
  }

  function follow() {
    const wanted = location.hash.startsWith(KEY) ? decodeURIComponent(location.hash.slice(KEY.length)) : '';
    if (!wanted || !show(wanted, false)) shut(false);
  }

  for (const card of cards) {
    card.addEventListener('click', event => {
      // a new tab, a new window, a download: the browser's own, as for any link
      if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
      if (show(card.getAttribute('href'), true)) event.preventDefault();
    });
  }
  window.addEventListener('popstate', follow);
  follow();
})();
