// Wide tables, code and equations scroll sideways inside their own box. A keyboard can scroll such a box only when
// it can be focused, and a screen reader announces it only when it has a name: each box that overflows at the
// current width gets tabindex=0, role=region and a label naming what it holds; one that fits again loses them, so
// a phone-only scroller adds no stop to the tab order on a desktop.
(function () {
  'use strict';
  const SELECTOR = '.table-wrap, pre, .step .eq, .across';

  // What the box holds: its table's caption, its figure's caption, or the heading of its section.
  function label(box) {
    const named = box.querySelector('caption') || box.closest('figure')?.querySelector('figcaption')
      || box.closest('section')?.querySelector('h2, h3');
    const text = named ? named.textContent.replace(/\s+/g, ' ').trim().replace(/\s*#$/, '') : '';
    const kind = box.matches('pre') ? 'Code' : box.matches('.eq') ? 'Equation' : 'Table';
    return (text ? kind + ': ' + text : kind) + ' (scrolls sideways)';
  }

  function mark() {
    const seen = new Map();  // regions are landmarks: two with one name could not be told apart
    for (const box of document.querySelectorAll(SELECTOR)) {
      const overflows = box.scrollWidth > box.clientWidth + 1;
      if (overflows && (box.hasAttribute('data-scrolls') || !box.hasAttribute('tabindex'))) {
        const name = label(box), n = (seen.get(name) || 0) + 1;
        seen.set(name, n);
        box.setAttribute('data-scrolls', '');
        box.setAttribute('tabindex', '0');
        box.setAttribute('role', 'region');
        box.setAttribute('aria-label', n > 1 ? name + ' ' + n : name);
      } else if (!overflows && box.hasAttribute('data-scrolls')) {
        for (const name of ['data-scrolls', 'tabindex', 'role', 'aria-label']) box.removeAttribute(name);
      }
    }
  }

  let pending = 0;
  mark();
  addEventListener('load', mark);
  const later = () => { cancelAnimationFrame(pending); pending = requestAnimationFrame(mark); };
  addEventListener('resize', later);
  // a box inside a closed <details> (the "All N steps" list) has no width until it opens: mark it then
  document.addEventListener('toggle', later, true);
})();
