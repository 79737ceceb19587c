/** The left-sidebar panel: collapsible sections, one component each (sections/index.ts). */

import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { SECTIONS, SectionProps } from './sections';

function Section(props: { id: string; title: string; open: boolean; children: React.ReactNode }) {
  const [open, setOpen] = React.useState(props.open);
  return (
    <section className={`jp-CloudTik-section ${open ? 'jp-mod-open' : ''}`} data-section={props.id}>
      <h2 className="jp-CloudTik-sectionTitle" onClick={() => setOpen(!open)}>
        <span className="jp-CloudTik-caret">{open ? '▾' : '▸'}</span> {props.title}
      </h2>
      {open && <div className="jp-CloudTik-sectionBody">{props.children}</div>}
    </section>
  );
}

export class CloudTikPanel extends ReactWidget {
  constructor(private props: SectionProps) {
    super();
    this.addClass('jp-CloudTik-panel');
  }

  update(props?: Partial<SectionProps>): void {
    if (props) {
      this.props = { ...this.props, ...props };
    }
    super.update();
  }

  render(): JSX.Element {
    return (
      <div className="jp-CloudTik-sections">
        {SECTIONS.map(s => (
          <Section key={s.id} id={s.id} title={s.title} open={s.open}>
            <s.component {...this.props} />
          </Section>
        ))}
      </div>
    );
  }
}
